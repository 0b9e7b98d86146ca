// y = x W^T (+ b) for bfloat16 x on AMX tiles (Sapphire Rapids and later), over the very weight packed_linear.cpp
// reads: panels of 32 output columns, each holding the columns' two weights side by side for every pair of inputs,
// [n / 32][k / 2][32][2]. That is AMX's own layout for the second operand of `tdpbf16ps` (16 rows of input pairs x
// 16 columns x 2), so one panel's columns 0-15 and 16-31 load as two tiles with a row stride of 128 bytes, and
// nothing is repacked. The loop is amx_gemm.h's; this file adds the bias, the one rounding to bfloat16 and, for
// SwiGLU's [gate | up] weight packed as packed_swiglu's, the activation (swiglu.h).
//
// Why: on an AMX CPU `vdpbf16ps` runs at a fraction of the tiles' rate (2 cores of a Xeon with AMX: 233 GFLOP/s
// for the AVX-512 BF16 packed kernel, 2.9 TFLOP/s for oneDNN on AMX at 4,096 rows; benchmarks/gemm_shapes.py).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "amx_gemm.h"
#include "swiglu.h"

#include <algorithm>
#include <cstdint>

namespace {

#if FRAME_AMX && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define FRAME_AMX_BF16 1

// c's first `rows` rows plus the bias, rounded once to bfloat16 (gated: silu(gate) * up) into y, or (y_float
// set) kept in float32 there.
void epilogue(const float* c, int64_t rows, int cols, bool gated, const float* bias, uint16_t* y, int64_t ldy,
              float* y_float) {
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v[2];
    for (int j = 0; j < cols; ++j) {
      v[j] = _mm512_load_ps(c + r * frame_cpu::amx::kPanel + 16 * j);
      if (bias != nullptr) v[j] = _mm512_add_ps(v[j], _mm512_loadu_ps(bias + 16 * j));
    }
    if (y_float != nullptr) {
      for (int j = 0; j < cols; ++j) _mm512_storeu_ps(y_float + r * ldy + 16 * j, v[j]);
    } else if (gated) {
      const __m256i out = frame_cpu::swiglu16(frame_cpu::round_to_bf16(v[0]), frame_cpu::round_to_bf16(v[1]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * ldy), out);
    } else {
      for (int j = 0; j < cols; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * ldy + 16 * j), frame_cpu::narrow16(v[j]));
    }
  }
}
#endif

at::Tensor amx_product(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t n, bool gated, bool float_out = false) {
#if FRAME_AMX_BF16
  TORCH_CHECK(frame_cpu::amx_permitted(), "Linux did not grant this process AMX's tile state (kernel 5.16+ needed)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16 && x.dim() == 2,
              "amx_linear takes a bfloat16 x [rows, in_features] and a bfloat16 packed weight");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1);
  TORCH_CHECK(k % 32 == 0 && n % (gated ? 32 : 16) == 0 && packed.numel() == n * k,
              "amx_linear needs in_features a multiple of 32 and out_features a multiple of 16 (of 32 for SwiGLU), "
              "and a weight packed by frame_platform_cpu.kernels");
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "bias must be float32 with out_features elements, ordered as the packed weight's columns");
    bias_ptr = bias->data_ptr<float>();
  }
  const int64_t width = gated ? n / 2 : n;
  at::Tensor y = at::empty({m, width}, float_out ? xc.options().dtype(at::kFloat) : xc.options());
  if (m == 0) return y;
  const at::Tensor pc = packed.contiguous();
  auto* yp = float_out ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr<c10::BFloat16>());
  float* yf = float_out ? y.data_ptr<float>() : nullptr;
  frame_cpu::amx::product<frame_cpu::amx::Dot::kBf16>(
      reinterpret_cast<const uint8_t*>(xc.data_ptr()), m, k * 2, reinterpret_cast<const uint8_t*>(pc.data_ptr()), n,
      [&](const int32_t* c, int64_t rows, int cols, int64_t row, int64_t panel) {
        const int64_t col = panel * frame_cpu::amx::kPanel;
        const int64_t at = row * width + (gated ? panel * 16 : col);
        epilogue(reinterpret_cast<const float*>(c), rows, cols, gated, bias_ptr ? bias_ptr + col : nullptr,
                 float_out ? nullptr : yp + at, width, float_out ? yf + at : nullptr);
      });
  return y;
#else
  TORCH_CHECK(false, "amx_linear needs a CPU with AMX BF16 and AVX-512 BF16; this build has no such instructions");
#endif
}

at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                      int64_t out_features) {
  return amx_product(x, packed, bias, out_features, false);
}

// The same product kept in float32 (no rounding): logits, which the sampler takes in float32 anyway, so the
// bfloat16 copy and its conversion (a [64, 49,152] tensor each decode step) are never made.
at::Tensor amx_linear_float(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                            int64_t out_features) {
  return amx_product(x, packed, bias, out_features, false, true);
}

at::Tensor amx_swiglu(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                      int64_t intermediate) {
  return amx_product(x, packed, bias, 2 * intermediate, true);
}

// True when this build has the AMX kernels and Linux lets the process use the tiles.
bool amx_available() {
#if FRAME_AMX_BF16
  return frame_cpu::amx_permitted();
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("amx_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("amx_linear_float(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("amx_swiglu(Tensor x, Tensor packed, Tensor? bias, int intermediate) -> Tensor");
  m.def("amx_available() -> bool", &amx_available);
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("amx_linear", &amx_linear);
  m.impl("amx_linear_float", &amx_linear_float);
  m.impl("amx_swiglu", &amx_swiglu);
}
