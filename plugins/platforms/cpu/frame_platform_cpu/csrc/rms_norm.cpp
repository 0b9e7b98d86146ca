// Residual add and RMS normalisation of bfloat16 or float32 rows in one pass: (norm(x + residual) * weight,
// x + residual); without a residual (a model's first norm), norm(x) * weight alone (plain_rms_norm).
//
// bfloat16 rounds exactly where torch's unfused bfloat16 sequence does (the sum to bfloat16, the normalised row to
// bfloat16 before the weight, the product to bfloat16); float32 computes what F.rms_norm and the weight's product
// do. Only the order of the float32 sum of squares differs. Rows are split over torch's intra-op threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "bfloat16_bits.h"
#include "direct_ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define FRAME_NORM_AVX2 1
#endif

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

// One row, sixteen values at a time: the sum is rounded and stored, then re-read for the scaling pass. Without a
// residual (b null) the row itself is normalised and s is not written.
void norm_row(const uint16_t* a, const uint16_t* b, const uint16_t* w, uint16_t* s, uint16_t* o, int64_t hidden,
              float epsilon) {
  __m512 squares = _mm512_setzero_ps();
  for (int64_t i = 0; i < hidden; i += 16) {
    const __mmask16 mask = tail_mask16(hidden - i);
    __m512 v = load16(a + i, mask);
    if (b != nullptr) {
      const __m256i sum = narrow16(_mm512_add_ps(v, load16(b + i, mask)));
      _mm256_mask_storeu_epi16(s + i, mask, sum);
      v = widen16(sum);
    }
    squares = _mm512_fmadd_ps(v, v, squares);  // masked-off lanes loaded as zero
  }
  const uint16_t* summed = b != nullptr ? s : a;
  const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(hidden) + epsilon);
  const __m512 scale = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < hidden; i += 16) {
    const __mmask16 mask = tail_mask16(hidden - i);
    const __m256i normed = narrow16(_mm512_mul_ps(load16(summed + i, mask), scale));
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
    const uint16_t sum = b != nullptr ? float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i])) : a[i];
    if (b != nullptr) s[i] = sum;
    row[i] = bf16_to_float(sum);
    squares += row[i] * row[i];
  }
  const float inv = 1.0f / std::sqrt(squares / static_cast<float>(hidden) + epsilon);
  for (int64_t j = 0; j < hidden; ++j)
    o[j] = float_to_bf16(bf16_to_float(w[j]) * bf16_to_float(float_to_bf16(row[j] * inv)));
}
#endif

// float32 rows: s = a + b, o = w * (s / sqrt(mean(s^2) + epsilon)); without b, s is a and not written.
void norm_row(const float* a, const float* b, const float* w, float* s, float* o, int64_t hidden, float epsilon) {
  int64_t i = 0;
  float squares = 0.0f;
#if FRAME_NORM_AVX2
  __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
  for (; i + 16 <= hidden; i += 16) {
    __m256 lo = _mm256_loadu_ps(a + i), hi = _mm256_loadu_ps(a + i + 8);
    if (b != nullptr) {
      lo = _mm256_add_ps(lo, _mm256_loadu_ps(b + i));
      hi = _mm256_add_ps(hi, _mm256_loadu_ps(b + i + 8));
      _mm256_storeu_ps(s + i, lo);
      _mm256_storeu_ps(s + i + 8, hi);
    }
    even = _mm256_fmadd_ps(lo, lo, even);
    odd = _mm256_fmadd_ps(hi, hi, odd);
  }
  const __m256 both = _mm256_add_ps(even, odd);
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(both), _mm256_extractf128_ps(both, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  squares = _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
#endif
  for (; i < hidden; ++i) {
    const float sum = b != nullptr ? a[i] + b[i] : a[i];
    if (b != nullptr) s[i] = sum;
    squares += sum * sum;
  }
  const float* summed = b != nullptr ? s : a;
  const float inv = 1.0f / std::sqrt(squares / static_cast<float>(hidden) + epsilon);
  for (int64_t j = 0; j < hidden; ++j) o[j] = w[j] * (summed[j] * inv);
}

// The checks of every form: x and residual [rows, hidden], weight [hidden], all bfloat16 or all float32.
void check_inputs(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && residual.scalar_type() == dtype &&
                  weight.scalar_type() == dtype, "add_rms_norm takes bfloat16 tensors or float32 ones");
  TORCH_CHECK(x.dim() == 2 && residual.sizes() == x.sizes() && weight.numel() == x.size(1),
              "x and residual [rows, hidden], weight [hidden]");
}

// The checks of a norm without a residual: x [rows, hidden] and weight [hidden], both bfloat16 or both float32.
void check_plain_inputs(const at::Tensor& x, const at::Tensor& weight) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && weight.scalar_type() == dtype,
              "plain_rms_norm takes bfloat16 tensors or float32 ones");
  TORCH_CHECK(x.dim() == 2 && weight.numel() == x.size(1), "x [rows, hidden], weight [hidden]");
}

// The checks of an `_into` form's outputs: contiguous tensors of x's shape and dtype.
void check_outputs(const at::Tensor& x, const at::Tensor& out, const at::Tensor& summed) {
  for (const at::Tensor* t : {&out, &summed})
    TORCH_CHECK(t->sizes() == x.sizes() && t->is_contiguous() && t->scalar_type() == x.scalar_type(),
                "out and summed must be contiguous tensors of x's shape and dtype");
}

// The rows of one call, checked and resolved to pointers: what every form runs, a share of the rows at a time.
struct NormRows {
  const void* x;
  const void* residual;  // null: a norm without a residual (and no summed)
  const void* weight;
  void* out;
  void* summed;
  int64_t rows, hidden;
  float epsilon;
  bool f32;

  int64_t units() const { return rows; }

  void run(int64_t begin, int64_t end) const {
    for (int64_t r = begin; r < end; ++r) {
      if (f32) {
        const auto* b = static_cast<const float*>(residual);
        auto* s = static_cast<float*>(summed);
        norm_row(static_cast<const float*>(x) + r * hidden, b ? b + r * hidden : nullptr,
                 static_cast<const float*>(weight), s ? s + r * hidden : nullptr,
                 static_cast<float*>(out) + r * hidden, hidden, epsilon);
      } else {
        const auto* b = static_cast<const uint16_t*>(residual);
        auto* s = static_cast<uint16_t*>(summed);
        norm_row(static_cast<const uint16_t*>(x) + r * hidden, b ? b + r * hidden : nullptr,
                 static_cast<const uint16_t*>(weight), s ? s + r * hidden : nullptr,
                 static_cast<uint16_t*>(out) + r * hidden, hidden, epsilon);
      }
    }
  }
};

// Checked contiguous operands as NormRows.
NormRows norm_rows(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                   const at::Tensor& out, const at::Tensor& summed) {
  check_inputs(x, residual, weight);
  check_outputs(x, out, summed);
  return NormRows{x.data_ptr(), residual.data_ptr(), weight.data_ptr(), out.data_ptr(), summed.data_ptr(),
                  x.size(0), x.size(1), static_cast<float>(eps), x.scalar_type() == at::kFloat};
}

// Checked contiguous operands of a norm without a residual as NormRows.
NormRows plain_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& out) {
  check_plain_inputs(x, weight);
  TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous() && out.scalar_type() == x.scalar_type(),
              "out must be a contiguous tensor of x's shape and dtype");
  return NormRows{x.data_ptr(), nullptr, weight.data_ptr(), out.data_ptr(), nullptr, x.size(0), x.size(1),
                  static_cast<float>(eps), x.scalar_type() == at::kFloat};
}

// `into`: the (normed, summed) pair to write (add_rms_norm_into, a replayed step's planned buffers), else new ones.
std::tuple<at::Tensor, at::Tensor> add_rms_norm_impl(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps,
                                                     const std::pair<at::Tensor, at::Tensor>* into) {
  check_inputs(x, residual, weight);
  const at::Tensor xc = x.contiguous(), rc = residual.contiguous(), wc = weight.contiguous();
  const at::Tensor out = into != nullptr ? into->first : at::empty_like(xc);
  const at::Tensor summed = into != nullptr ? into->second : at::empty_like(xc);
  const NormRows rows = norm_rows(xc, rc, wc, eps, out, summed);
  at::parallel_for(0, rows.rows, 16, [&](int64_t begin, int64_t end) { rows.run(begin, end); });
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

// A norm without a residual (a model's first): norm(x) * weight, rounded as add_rms_norm's out with a residual of
// zeros. `into`: the tensor to write, else a new one.
at::Tensor plain_rms_norm_impl(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor* into) {
  check_plain_inputs(x, weight);
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  const at::Tensor out = into != nullptr ? *into : at::empty_like(xc);
  const NormRows rows = plain_norm_rows(xc, wc, eps, out);
  at::parallel_for(0, rows.rows, 16, [&](int64_t begin, int64_t end) { rows.run(begin, end); });
  return out;
}

at::Tensor plain_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return plain_rms_norm_impl(x, weight, eps, nullptr);
}

void plain_rms_norm_into(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
  plain_rms_norm_impl(x, weight, eps, &out);
}

const frame_cpu::RegisterDirect direct_plain_rms_norm("frame_cpu::plain_rms_norm_into", [](const c10::IValue* const* a) {
  plain_rms_norm_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toDouble(), frame_cpu::written(a[3]));
});

const frame_cpu::RegisterBind bind_plain_rms_norm("frame_cpu::plain_rms_norm_into",
                                                  [](const c10::IValue* const* a, frame_cpu::BoundCall& call) {
  const at::Tensor &x = a[0]->toTensor(), &weight = a[1]->toTensor(), &out = a[3]->toTensor();
  if (!x.is_contiguous() || !weight.is_contiguous()) return false;
  frame_cpu::bind_shares(call, plain_norm_rows(x, weight, a[2]->toDouble(), out));
  return true;
}, frame_cpu::Stretch::kJoins);

const frame_cpu::RegisterDirect direct_add_rms_norm("frame_cpu::add_rms_norm_into", [](const c10::IValue* const* a) {
  add_rms_norm_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toTensor(), a[3]->toDouble(), frame_cpu::written(a[4]),
                    frame_cpu::written(a[5]));
});

// The bound form (direct_ops.h): the checked pointers, each thread of a team normalising its share of the rows.
const frame_cpu::RegisterBind bind_add_rms_norm("frame_cpu::add_rms_norm_into",
                                                [](const c10::IValue* const* a, frame_cpu::BoundCall& call) {
  const at::Tensor &x = a[0]->toTensor(), &residual = a[1]->toTensor(), &weight = a[2]->toTensor();
  if (!x.is_contiguous() || !residual.is_contiguous() || !weight.is_contiguous()) return false;
  frame_cpu::bind_shares(call, norm_rows(x, residual, weight, a[3]->toDouble(), a[4]->toTensor(), a[5]->toTensor()));
  return true;
}, frame_cpu::Stretch::kJoins);

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("add_rms_norm_into(Tensor x, Tensor residual, Tensor weight, float eps, Tensor(a!) out, "
        "Tensor(b!) summed) -> ()");
  m.def("plain_rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("plain_rms_norm_into(Tensor x, Tensor weight, float eps, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("add_rms_norm_into", &add_rms_norm_into);
  m.impl("plain_rms_norm", &plain_rms_norm);
  m.impl("plain_rms_norm_into", &plain_rms_norm_into);
}
