// SwiGLU's activation in one pass over bfloat16 rows [gate | up]: silu(gate) * up.
//
// Rounds where torch's two bfloat16 ops do (silu's result to bfloat16, then the product); silu itself is
// x / (1 + exp(-x)) in float32 with a polynomial exp (relative error about 1e-7), so a value may land one
// bfloat16 step from torch's now and then. Rows are split over torch's intra-op threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "bfloat16_bits.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

using frame_cpu::bf16_to_float;
using frame_cpu::float_to_bf16;

// exp(x) for x in [-87, 88], vectorisable: 2^n * exp(t), n = round(x / ln 2), degree-6 polynomial for exp(t).
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f;
  const float t = x - n * 0.6931471805599453f;
  float p = 1.0f / 720.0f;
  p = p * t + 1.0f / 120.0f;
  p = p * t + 1.0f / 24.0f;
  p = p * t + 1.0f / 6.0f;
  p = p * t + 0.5f;
  p = p * t + 1.0f;
  p = p * t + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) % 2 == 0,
              "silu_and_mul takes bfloat16 [rows, 2 * width]");
  const at::Tensor xc = x.contiguous();
  const int64_t rows = xc.size(0), width = xc.size(1) / 2;
  at::Tensor out = at::empty({rows, width}, xc.options());
  const auto* in = reinterpret_cast<const uint16_t*>(xc.data_ptr<c10::BFloat16>());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* gate = in + r * 2 * width;
      const uint16_t* up = gate + width;
      uint16_t* dst = o + r * width;
      for (int64_t i = 0; i < width; ++i) {
        const float g = bf16_to_float(gate[i]);
        const float silu = bf16_to_float(float_to_bf16(g / (1.0f + exp_approx(-g))));
        dst[i] = float_to_bf16(silu * bf16_to_float(up[i]));
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) { m.def("silu_and_mul(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) { m.impl("silu_and_mul", &silu_and_mul); }
