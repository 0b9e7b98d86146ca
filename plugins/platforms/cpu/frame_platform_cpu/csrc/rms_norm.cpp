// Residual add and RMS normalisation of bfloat16 rows in one pass: (norm(x + residual) * weight, x + residual).
//
// It rounds exactly where torch's unfused bfloat16 sequence does (the sum to bfloat16, the normalised row to
// bfloat16 before the weight, the product to bfloat16); only the order of the float32 sum of squares differs.
// Rows are split over torch's intra-op threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "bfloat16_bits.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace {

using frame_cpu::bf16_to_float;
using frame_cpu::float_to_bf16;

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && residual.scalar_type() == at::kBFloat16 &&
                  weight.scalar_type() == at::kBFloat16, "add_rms_norm takes bfloat16 tensors");
  TORCH_CHECK(x.dim() == 2 && residual.sizes() == x.sizes() && weight.numel() == x.size(1),
              "x and residual [rows, hidden], weight [hidden]");
  const at::Tensor xc = x.contiguous(), rc = residual.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc), summed = at::empty_like(xc);
  const int64_t rows = xc.size(0), hidden = xc.size(1);
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<c10::BFloat16>());
  const auto* rp = reinterpret_cast<const uint16_t*>(rc.data_ptr<c10::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(wc.data_ptr<c10::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  auto* sp = reinterpret_cast<uint16_t*>(summed.data_ptr<c10::BFloat16>());
  const float epsilon = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(hidden);
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* a = xp + r * hidden;
      const uint16_t* b = rp + r * hidden;
      uint16_t* s = sp + r * hidden;
      float lanes[16] = {};
      int64_t i = 0;
      for (; i + 16 <= hidden; i += 16)
        for (int l = 0; l < 16; ++l) {
          const uint16_t sum = float_to_bf16(bf16_to_float(a[i + l]) + bf16_to_float(b[i + l]));
          s[i + l] = sum;
          row[i + l] = bf16_to_float(sum);
          lanes[l] += row[i + l] * row[i + l];
        }
      float squares = 0.0f;
      for (; i < hidden; ++i) {
        s[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
        row[i] = bf16_to_float(s[i]);
        squares += row[i] * row[i];
      }
      for (int l = 0; l < 16; ++l) squares += lanes[l];
      const float inv = 1.0f / std::sqrt(squares / static_cast<float>(hidden) + epsilon);
      uint16_t* o = op + r * hidden;
      for (int64_t j = 0; j < hidden; ++j)
        o[j] = float_to_bf16(bf16_to_float(wp[j]) * bf16_to_float(float_to_bf16(row[j] * inv)));
    }
  });
  return {out, summed};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) { m.impl("add_rms_norm", &add_rms_norm); }
