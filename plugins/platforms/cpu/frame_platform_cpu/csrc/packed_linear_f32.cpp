// y = x W^T (+ b) for float32 x and a float32 weight packed once into 16-column panels, with AVX2 FMA: every
// float32 linear of the model on x86 CPUs without AVX-512 BF16 (AVX2-only parts such as AMD Zen 2/3).
//
// torch's float32 F.linear goes to MKL, whose matrix-vector path streams the weight once per call, but whose GEMM
// for 2 to 16 rows (speculative decoding's verification steps, small batches) measured 3x the one-row time on a
// Zen 3 core: fixed costs and packing that a handful of rows cannot amortise. Here the weight is packed once as
// panels of 16 output columns, [n / 16][k][16]: for each input feature, the panel's 16 weights side by side, two
// ymm loads. A tile of up to 6 rows x 16 columns keeps its 12 float32 accumulators in registers over the whole of
// k; each weight pair is loaded once for the whole tile and each input broadcast once per row. A panel is read from
// memory once and from L1/L2 for each further row tile; panels are split over torch's intra-op threads.
//
// Each output is one float32 sum over k in order, whatever the number of rows, so a row's result does not depend
// on what it is batched with.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kPanel = 16;  // output columns per packed panel: two ymm registers of float32 accumulators
constexpr int kRowTile = 6;     // rows per register tile: 6 x 2 accumulators, two weight registers, one broadcast

#if defined(__AVX2__) && defined(__FMA__)
template <int R>
void tile(const float* x, int64_t ldx, const float* panel, int64_t k, const float* bias, float* y, int64_t ldy) {
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const __m256 w0 = _mm256_loadu_ps(panel + i * kPanel);
    const __m256 w1 = _mm256_loadu_ps(panel + i * kPanel + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + i);
      acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if (bias != nullptr) {
      acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_loadu_ps(bias));
      acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_loadu_ps(bias + 8));
    }
    _mm256_storeu_ps(y + r * ldy, acc[r][0]);
    _mm256_storeu_ps(y + r * ldy + 8, acc[r][1]);
  }
}

void tile_rows(int rows, const float* x, int64_t ldx, const float* panel, int64_t k, const float* bias, float* y,
               int64_t ldy) {
  switch (rows) {
#define FRAME_TILE_CASE(R) \
  case R: tile<R>(x, ldx, panel, k, bias, y, ldy); break;
    FRAME_TILE_CASE(1) FRAME_TILE_CASE(2) FRAME_TILE_CASE(3) FRAME_TILE_CASE(4) FRAME_TILE_CASE(5) FRAME_TILE_CASE(6)
#undef FRAME_TILE_CASE
    default: TORCH_CHECK(false, "row tile of ", rows);
  }
}
#endif

at::Tensor packed_linear_f32(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                             int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat,
              "packed_linear_f32 takes a float32 x and a float32 packed weight");
  TORCH_CHECK(x.dim() == 2, "packed_linear_f32 takes x of shape [rows, in_features]");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1);
  TORCH_CHECK(n % kPanel == 0 && packed.numel() == n * k,
              "the packed weight must hold out_features x in_features with out_features a multiple of 16; pack it "
              "with frame_platform_cpu.kernels.pack_weight_f32");
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "bias must be float32 with out_features elements");
    bias_ptr = bias->data_ptr<float>();
  }
  at::Tensor y = at::empty({m, n}, xc.options());
  if (m == 0) return y;
  const at::Tensor pc = packed.contiguous();
  const float* xp = xc.data_ptr<float>();
  const float* wp = pc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Tiles of equal height (8 rows: two of 4, not 6 and 2): every tile costs a pass over the panel's weights.
  const int64_t tiles = (m + kRowTile - 1) / kRowTile;
  const int64_t height = (m + tiles - 1) / tiles;
  at::parallel_for(0, n / kPanel, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t col = p * kPanel;
      for (int64_t r = 0; r < m; r += height) {
        const int rows = static_cast<int>(std::min<int64_t>(height, m - r));
        tile_rows(rows, xp + r * k, k, wp + col * k, k, bias_ptr ? bias_ptr + col : nullptr, yp + r * n + col, n);
      }
    }
  });
  return y;
#else
  TORCH_CHECK(false, "packed_linear_f32 needs a CPU with AVX2 and FMA; this build has no such instructions");
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("packed_linear_f32(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) { m.impl("packed_linear_f32", &packed_linear_f32); }
