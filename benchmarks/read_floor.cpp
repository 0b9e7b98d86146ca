// The read floor of a decode step's linears as a torch op, so that benchmarks/decode_rows.py can time it in the
// same process and the same minute as the kernels: `frame_bench::read_floor(buffer)` reads the buffer once, front
// to back, split evenly over torch's intra-op threads, with cpu_floor.cpp's loop (four independent 256-bit sums,
// 256 bytes a step), and returns its sum so the reads cannot be dropped.
//
// `frame_bench::core_round_trip(cpu_a, cpu_b, trips)` is the mean time, in nanoseconds, for one cache line to go
// from a thread pinned to cpu_a to one pinned to cpu_b and back. On a virtual machine it says where the host put
// the two virtual CPUs: on an AMD EPYC, about 80 ns when they share a CCD (one L3 and one link to memory) and about
// 350 ns when they sit on two, which doubles the memory bandwidth two threads can draw (benchmarks/host_probe.py).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>
#include <immintrin.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
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

void pin(int64_t cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<int>(cpu), &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

double core_round_trip(int64_t cpu_a, int64_t cpu_b, int64_t trips) {
  TORCH_CHECK(trips > 0 && cpu_a >= 0 && cpu_b >= 0 && cpu_a < CPU_SETSIZE && cpu_b < CPU_SETSIZE,
              "core_round_trip takes two CPU numbers and a positive count");
  alignas(64) static std::atomic<int64_t> flag;
  flag.store(0);
  double seconds = 0.0;
  std::thread pong([&] {
    pin(cpu_b);
    for (int64_t i = 0; i < trips; ++i) {
      while (flag.load(std::memory_order_acquire) != 2 * i + 1) {}
      flag.store(2 * i + 2, std::memory_order_release);
    }
  });
  std::thread ping([&] {
    pin(cpu_a);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < trips; ++i) {
      flag.store(2 * i + 1, std::memory_order_release);
      while (flag.load(std::memory_order_acquire) != 2 * i + 2) {}
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  ping.join();
  pong.join();
  return seconds / static_cast<double>(trips) * 1e9;
}

}  // namespace

TORCH_LIBRARY(frame_bench, m) {
  m.def("read_floor(Tensor buffer) -> float", &read_floor);
  m.def("core_round_trip(int cpu_a, int cpu_b, int trips) -> float", &core_round_trip);
}
