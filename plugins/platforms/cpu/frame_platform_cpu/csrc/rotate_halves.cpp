// Rotary embedding in place on bfloat16 or float32 Q/K rows (first half of each head paired with the second), one
// pass.
//
// x is [tokens, heads, dim] with any token stride (the Q and K columns of the fused QKV output), cos and sin are
// [tokens, dim / 2]. bfloat16 rounds exactly where torch's unfused bfloat16 sequence does (first*cos, second*sin
// and their difference; second*cos, then second + first*sin in float32), so the result is bitwise the same;
// float32 computes the same two expressions in float32.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "bfloat16_bits.h"
#include "direct_ops.h"

#include <cstdint>
#include <cstring>

namespace {

using frame_cpu::bf16_to_float;
using frame_cpu::float_to_bf16;

// One head's halves, float32: first' = first cos - second sin, second' = second cos + first sin.
void rotate_head(float* first, const float* c, const float* s, int64_t half) {
  float* second = first + half;
  for (int64_t i = 0; i < half; ++i) {
    const float a = first[i], b = second[i];
    first[i] = a * c[i] - b * s[i];
    second[i] = b * c[i] + a * s[i];
  }
}

void rotate_halves_f32(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t tokens = x.size(0), heads = x.size(1), half = x.size(2) / 2, stride = x.stride(0);
  const at::Tensor cc = cos.contiguous(), sc = sin.contiguous();
  float* xp = x.data_ptr<float>();
  const float* cp = cc.data_ptr<float>();
  const float* sp = sc.data_ptr<float>();
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < heads; ++h) rotate_head(xp + t * stride + h * 2 * half, cp + t * half, sp + t * half, half);
  });
}

void rotate_halves_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && cos.scalar_type() == dtype &&
                  sin.scalar_type() == dtype, "rotate_halves_ takes bfloat16 tensors or float32 ones");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2) && x.size(2) % 2 == 0,
              "x must be [tokens, heads, dim] with contiguous heads");
  const int64_t tokens = x.size(0), heads = x.size(1), half = x.size(2) / 2, stride = x.stride(0);
  TORCH_CHECK(cos.numel() == tokens * half && sin.numel() == tokens * half, "cos and sin must be [tokens, dim / 2]");
  if (dtype == at::kFloat) return rotate_halves_f32(x, cos, sin);
  const at::Tensor cc = cos.contiguous(), sc = sin.contiguous();
  auto* xp = reinterpret_cast<uint16_t*>(x.data_ptr<c10::BFloat16>());
  const auto* cp = reinterpret_cast<const uint16_t*>(cc.data_ptr<c10::BFloat16>());
  const auto* sp = reinterpret_cast<const uint16_t*>(sc.data_ptr<c10::BFloat16>());
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* c = cp + t * half;
      const uint16_t* s = sp + t * half;
      for (int64_t h = 0; h < heads; ++h) {
        uint16_t* first = xp + t * stride + h * 2 * half;
        uint16_t* second = first + half;
        for (int64_t i = 0; i < half; ++i) {
          const float a = bf16_to_float(first[i]), b = bf16_to_float(second[i]);
          const float ci = bf16_to_float(c[i]), si = bf16_to_float(s[i]);
          const float a_cos = bf16_to_float(float_to_bf16(a * ci)), b_sin = bf16_to_float(float_to_bf16(b * si));
          const uint16_t rotated = float_to_bf16(a_cos - b_sin);
          second[i] = float_to_bf16(bf16_to_float(float_to_bf16(b * ci)) + a * si);
          first[i] = rotated;
        }
      }
    }
  });
}

const frame_cpu::RegisterDirect direct_rotate("frame_cpu::rotate_halves_", [](const c10::IValue* const* a) {
  rotate_halves_(frame_cpu::written(a[0]), a[1]->toTensor(), a[2]->toTensor());
});

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) { m.def("rotate_halves_(Tensor(a!) x, Tensor cos, Tensor sin) -> ()"); }

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) { m.impl("rotate_halves_", &rotate_halves_); }
