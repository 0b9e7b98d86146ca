// y = x W^T (+ b) for bfloat16 weights and few rows of x: the decode-time linear layers of a small batch.
//
// With one to a few dozen rows the product is bound by reading W once from memory. torch's bfloat16 path reads
// it at about half the memory bandwidth on some CPUs; this kernel streams each weight row once, takes the dot
// products of every x row against it (AVX-512 BF16 `vdpbf16ps` where the CPU has it, float32 otherwise) and
// rounds to bfloat16 at the end, as torch does. Output rows are split over torch's intra-op threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "bfloat16_bits.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

using frame_cpu::bf16_to_float;
using frame_cpu::float_to_bf16;

constexpr int64_t kRowTile = 64;  // weight rows per tile: every x row block reuses the tile from cache
constexpr int kMaxBlock = 8;      // x rows whose accumulators stay in registers together

#if defined(__AVX512BF16__)
template <int B>
inline void dot_rows(const uint16_t* w, const uint16_t* x, int64_t k, float* out) {
  __m512 acc[B];
  for (int b = 0; b < B; ++b) acc[b] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + i);
    for (int b = 0; b < B; ++b)
      acc[b] = _mm512_dpbf16_ps(acc[b], wv, (__m512bh)_mm512_loadu_si512(x + b * k + i));
  }
  if (i < k) {
    const __mmask32 mask = (__mmask32)((1ull << (k - i)) - 1);
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + i);
    for (int b = 0; b < B; ++b)
      acc[b] = _mm512_dpbf16_ps(acc[b], wv, (__m512bh)_mm512_maskz_loadu_epi16(mask, x + b * k + i));
  }
  for (int b = 0; b < B; ++b) out[b] = _mm512_reduce_add_ps(acc[b]);
}
#else
template <int B>
inline void dot_rows(const uint16_t* w, const uint16_t* x, int64_t k, float* out) {
  float lanes[B][16] = {};
  int64_t i = 0;
  for (; i + 16 <= k; i += 16)
    for (int b = 0; b < B; ++b)
      for (int l = 0; l < 16; ++l) lanes[b][l] += bf16_to_float(w[i + l]) * bf16_to_float(x[b * k + i + l]);
  for (int b = 0; b < B; ++b) {
    float total = 0.0f;
    for (int64_t j = i; j < k; ++j) total += bf16_to_float(w[j]) * bf16_to_float(x[b * k + j]);
    for (int l = 0; l < 16; ++l) total += lanes[b][l];
    out[b] = total;
  }
}
#endif

template <int B>
void block(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t k, int64_t n,
           int64_t row_begin, int64_t row_end) {
  float sums[B];
  for (int64_t o = row_begin; o < row_end; ++o) {
    dot_rows<B>(w + o * k, x, k, sums);
    const float b = bias ? bf16_to_float(bias[o]) : 0.0f;
    for (int r = 0; r < B; ++r) y[r * n + o] = float_to_bf16(sums[r] + b);
  }
}

void rows_of(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t m, int64_t k,
             int64_t n, int64_t row_begin, int64_t row_end) {
  for (int64_t r = 0; r < m;) {
    const int64_t left = m - r;
    const uint16_t* xr = x + r * k;
    uint16_t* yr = y + r * n;
    if (left >= 8) { block<8>(xr, w, bias, yr, k, n, row_begin, row_end); r += 8; }
    else if (left >= 4) { block<4>(xr, w, bias, yr, k, n, row_begin, row_end); r += 4; }
    else if (left >= 2) { block<2>(xr, w, bias, yr, k, n, row_begin, row_end); r += 2; }
    else { block<1>(xr, w, bias, yr, k, n, row_begin, row_end); r += 1; }
  }
}

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "small_linear takes bfloat16 inputs and weights");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x [m, k] and weight [n, k]");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), n = wc.size(0);
  at::Tensor bc;
  const uint16_t* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->numel() == n, "bias must be bfloat16 [n]");
    bc = bias->contiguous();
    bias_ptr = reinterpret_cast<const uint16_t*>(bc.data_ptr<c10::BFloat16>());
  }
  at::Tensor y = at::empty({m, n}, xc.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<c10::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(wc.data_ptr<c10::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<c10::BFloat16>());
  at::parallel_for(0, (n + kRowTile - 1) / kRowTile, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      rows_of(xp, wp, bias_ptr, yp, m, k, n, t * kRowTile, std::min(n, (t + 1) * kRowTile));
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(frame_cpu, m) { m.def("small_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor"); }

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) { m.impl("small_linear", &small_linear); }
