// SwiGLU's activation in one pass over bfloat16 rows [gate | up]: silu(gate) * up.
//
// Rounds where torch's two bfloat16 ops do (silu's result to bfloat16, then the product); silu itself is
// x / (1 + exp(-x)) in float32 with a polynomial exp (swiglu.h), so a value may land one bfloat16 step from
// torch's now and then. Rows are split over torch's intra-op threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "bfloat16_bits.h"
#include "swiglu.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

using frame_cpu::bf16_to_float;
using frame_cpu::float_to_bf16;

void silu_and_mul_row(const uint16_t* gate, const uint16_t* up, uint16_t* dst, int64_t width) {
#if FRAME_AVX512_BF16_BITS
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 mask = frame_cpu::tail_mask16(width - i);
    _mm256_mask_storeu_epi16(dst + i, mask,
                             frame_cpu::swiglu16(frame_cpu::load16(gate + i, mask), frame_cpu::load16(up + i, mask)));
  }
#else
  for (int64_t i = 0; i < width; ++i) {
    const float g = bf16_to_float(gate[i]);
    const float silu = bf16_to_float(float_to_bf16(g / (1.0f + frame_cpu::exp_approx(-g))));
    dst[i] = float_to_bf16(silu * bf16_to_float(up[i]));
  }
#endif
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
      silu_and_mul_row(gate, gate + width, o + r * width, width);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) { m.def("silu_and_mul(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) { m.impl("silu_and_mul", &silu_and_mul); }
