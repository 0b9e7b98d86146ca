// The read floor of a decode step's linears as a torch op, so that benchmarks/decode_rows.py can time it in the
// same process and the same minute as the kernels: `frame_bench::read_floor(buffer)` reads the buffer once, front
// to back, split evenly over torch's intra-op threads, with cpu_floor.cpp's loop (four independent 256-bit sums,
// 256 bytes a step), and returns its sum so the reads cannot be dropped.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>
#include <immintrin.h>

#include <cstdint>
#include <vector>

namespace {

double read_floor(const at::Tensor& buffer) {
  TORCH_CHECK(buffer.scalar_type() == at::kFloat && buffer.is_contiguous() && buffer.numel() % 64 == 0,
              "read_floor takes a contiguous float32 buffer of a multiple of 64 values");
  const float* data = buffer.data_ptr<float>();
  const int64_t lines = buffer.numel() / 64;
  std::vector<double> partial(at::get_num_threads() + 1, 0.0);
  at::parallel_for(0, lines, 1024, [&](int64_t begin, int64_t end) {
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    for (int64_t block = begin; block < end; ++block) {
      const float* p = data + block * 64;
      a = _mm256_add_ps(a, _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 32)));
      b = _mm256_add_ps(b, _mm256_add_ps(_mm256_loadu_ps(p + 8), _mm256_loadu_ps(p + 40)));
      c = _mm256_add_ps(c, _mm256_add_ps(_mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 48)));
      d = _mm256_add_ps(d, _mm256_add_ps(_mm256_loadu_ps(p + 24), _mm256_loadu_ps(p + 56)));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    partial[at::get_thread_num()] += lanes[0] + lanes[7];
  });
  double total = 0.0;
  for (double v : partial) total += v;
  return total;
}

}  // namespace

TORCH_LIBRARY(frame_bench, m) { m.def("read_floor(Tensor buffer) -> float", &read_floor); }
