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
#include "direct_ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using frame_cpu::bf16_to_float;
using frame_cpu::float_to_bf16;

#if FRAME_AVX512_BF16_BITS
using frame_cpu::load16;
using frame_cpu::narrow16;
using frame_cpu::tail_mask16;
using frame_cpu::widen16;

// One row, sixteen values at a time: the sum is rounded and stored, then re-read for the scaling pass.
void norm_row(const uint16_t* a, const uint16_t* b, const uint16_t* w, uint16_t* s, uint16_t* o, int64_t hidden,
              float epsilon) {
  __m512 squares = _mm512_setzero_ps();
  for (int64_t i = 0; i < hidden; i += 16) {
    const __mmask16 mask = tail_mask16(hidden - i);
    const __m256i sum = narrow16(_mm512_add_ps(load16(a + i, mask), load16(b + i, mask)));
    _mm256_mask_storeu_epi16(s + i, mask, sum);
    const __m512 v = widen16(sum);
    squares = _mm512_fmadd_ps(v, v, squares);  // masked-off lanes loaded as zero
  }
  const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(hidden) + epsilon);
  const __m512 scale = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < hidden; i += 16) {
    const __mmask16 mask = tail_mask16(hidden - i);
    const __m256i normed = narrow16(_mm512_mul_ps(load16(s + i, mask), scale));
    const __m512 n = widen16(normed);
    _mm256_mask_storeu_epi16(o + i, mask, narrow16(_mm512_mul_ps(load16(w + i, mask), n)));
  }
}
#else
void norm_row(const uint16_t* a, const uint16_t* b, const uint16_t* w, uint16_t* s, uint16_t* o, int64_t hidden,
              float epsilon) {
  std::vector<float> row(hidden);
  float squares = 0.0f;
  for (int64_t i = 0; i < hidden; ++i) {
    s[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
    row[i] = bf16_to_float(s[i]);
    squares += row[i] * row[i];
  }
  const float inv = 1.0f / std::sqrt(squares / static_cast<float>(hidden) + epsilon);
  for (int64_t j = 0; j < hidden; ++j)
    o[j] = float_to_bf16(bf16_to_float(w[j]) * bf16_to_float(float_to_bf16(row[j] * inv)));
}
#endif

// The checks of every form: bfloat16 x and residual [rows, hidden], weight [hidden].
void check_inputs(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && residual.scalar_type() == at::kBFloat16 &&
                  weight.scalar_type() == at::kBFloat16, "add_rms_norm takes bfloat16 tensors");
  TORCH_CHECK(x.dim() == 2 && residual.sizes() == x.sizes() && weight.numel() == x.size(1),
              "x and residual [rows, hidden], weight [hidden]");
}

// The checks of an `_into` form's outputs: contiguous bfloat16 tensors of x's shape.
void check_outputs(const at::Tensor& x, const at::Tensor& out, const at::Tensor& summed) {
  for (const at::Tensor* t : {&out, &summed})
    TORCH_CHECK(t->sizes() == x.sizes() && t->is_contiguous() && t->scalar_type() == at::kBFloat16,
                "out and summed must be contiguous bfloat16 tensors of x's shape");
}

// `into`: the (normed, summed) pair to write (add_rms_norm_into, a replayed step's planned buffers), else new ones.
std::tuple<at::Tensor, at::Tensor> add_rms_norm_impl(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps,
                                                     const std::pair<at::Tensor, at::Tensor>* into) {
  check_inputs(x, residual, weight);
  const at::Tensor xc = x.contiguous(), rc = residual.contiguous(), wc = weight.contiguous();
  at::Tensor out, summed;
  if (into != nullptr) {
    check_outputs(xc, into->first, into->second);
    out = into->first;
    summed = into->second;
  } else {
    out = at::empty_like(xc);
    summed = at::empty_like(xc);
  }
  const int64_t rows = xc.size(0), hidden = xc.size(1);
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<c10::BFloat16>());
  const auto* rp = reinterpret_cast<const uint16_t*>(rc.data_ptr<c10::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(wc.data_ptr<c10::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  auto* sp = reinterpret_cast<uint16_t*>(summed.data_ptr<c10::BFloat16>());
  const float epsilon = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      norm_row(xp + r * hidden, rp + r * hidden, wp, sp + r * hidden, op + r * hidden, hidden, epsilon);
  });
  return {out, summed};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  return add_rms_norm_impl(x, residual, weight, eps, nullptr);
}

void add_rms_norm_into(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                       at::Tensor& out, at::Tensor& summed) {
  const std::pair<at::Tensor, at::Tensor> into{out, summed};
  add_rms_norm_impl(x, residual, weight, eps, &into);
}

const frame_cpu::RegisterDirect direct_add_rms_norm("frame_cpu::add_rms_norm_into", [](const c10::IValue* const* a) {
  add_rms_norm_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toTensor(), a[3]->toDouble(), frame_cpu::written(a[4]),
                    frame_cpu::written(a[5]));
});

// The bound form (direct_ops.h): the checked pointers, each thread of a team normalising its share of the rows.
struct BoundNorm {
  const uint16_t* x;
  const uint16_t* residual;
  const uint16_t* weight;
  uint16_t* out;
  uint16_t* summed;
  int64_t rows, hidden;
  float epsilon;
};

const frame_cpu::RegisterBind bind_add_rms_norm("frame_cpu::add_rms_norm_into",
                                                [](const c10::IValue* const* a, frame_cpu::BoundCall& call) {
  const at::Tensor &x = a[0]->toTensor(), &residual = a[1]->toTensor(), &weight = a[2]->toTensor();
  const at::Tensor &out = a[4]->toTensor(), &summed = a[5]->toTensor();
  if (!x.is_contiguous() || !residual.is_contiguous() || !weight.is_contiguous()) return false;
  check_inputs(x, residual, weight);
  check_outputs(x, out, summed);
  call.as<BoundNorm>() = BoundNorm{reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()),
                                   reinterpret_cast<const uint16_t*>(residual.data_ptr<c10::BFloat16>()),
                                   reinterpret_cast<const uint16_t*>(weight.data_ptr<c10::BFloat16>()),
                                   reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()),
                                   reinterpret_cast<uint16_t*>(summed.data_ptr<c10::BFloat16>()),
                                   x.size(0), x.size(1), static_cast<float>(a[3]->toDouble())};
  call.shared = true;
  call.run = [](const frame_cpu::BoundCall& bound, const frame_cpu::Team& team) {
    const BoundNorm& n = bound.as<BoundNorm>();
    const auto [begin, end] = frame_cpu::share(n.rows, team);
    for (int64_t r = begin; r < end; ++r)
      norm_row(n.x + r * n.hidden, n.residual + r * n.hidden, n.weight, n.summed + r * n.hidden, n.out + r * n.hidden,
               n.hidden, n.epsilon);
  };
  return true;
});

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("add_rms_norm_into(Tensor x, Tensor residual, Tensor weight, float eps, Tensor(a!) out, "
        "Tensor(b!) summed) -> ()");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("add_rms_norm_into", &add_rms_norm_into);
}
