// RMS normalisation without a residual add, of rows or of each head of [tokens, heads, head_dim] in place: the
// norms Gemma and OLMo 2 weight in float32 (frame.layers.UpcastRMSNorm, their per-head query and key norms) and
// Qwen 3's per-head norms.
//
// The weight's dtype says where the result rounds. A float32 weight (Gemma's `1 + w` folded in once) multiplies
// the float32 normalised value and the product rounds once to x's dtype, as `(F.rms_norm(x.float()) * w).to(dtype)`
// does. A weight of x's dtype (bfloat16) multiplies the normalised value rounded first, as Llama's norm does. Only
// the order of the float32 sum of squares differs from torch's. Rows are split over torch's intra-op threads, or
// over a step program's team (the bound forms).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "bfloat16_bits.h"
#include "direct_ops.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace {

inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return frame_cpu::bf16_to_float(v); }
inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) { *p = frame_cpu::float_to_bf16(v); }

// One row of `n` values (x and o may be the same row).
template <class T, class W>
void norm_row(const T* x, const W* w, T* o, int64_t n, float epsilon) {
  float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < n; ++i) squares += widen(x[i]) * widen(x[i]);
  const float inv = 1.0f / std::sqrt(squares / static_cast<float>(n) + epsilon);
  if constexpr (std::is_same_v<W, float>) {
    for (int64_t i = 0; i < n; ++i) store(o + i, widen(x[i]) * inv * w[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) store(o + i, widen(w[i]) * widen(T(frame_cpu::float_to_bf16(widen(x[i]) * inv))));
  }
}

// The rows of one call, checked and resolved to pointers: row (t, h) at x + t * x_token + h * x_head, its result at
// the same place of out.
struct RowNorms {
  const void* x;
  void* out;
  const void* weight;
  int64_t tokens, heads, width, x_token, x_head, out_token, out_head;
  float epsilon;
  bool f32;     // x (and out) float32, else bfloat16
  bool upcast;  // the weight float32, else x's dtype

  int64_t units() const { return tokens * heads; }

  template <class T, class W>
  void run_as(int64_t begin, int64_t end) const {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r / heads, h = r % heads;
      norm_row(static_cast<const T*>(x) + t * x_token + h * x_head, static_cast<const W*>(weight),
               static_cast<T*>(out) + t * out_token + h * out_head, width, epsilon);
    }
  }

  void run(int64_t begin, int64_t end) const {
    if (f32) run_as<float, float>(begin, end);
    else if (upcast) run_as<uint16_t, float>(begin, end);
    else run_as<uint16_t, uint16_t>(begin, end);
  }
};

RowNorms row_norms(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& out) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat, "rms_norm takes bfloat16 or float32 x");
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == dtype,
              "rms_norm takes a float32 weight or one of x's dtype");
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "rms_norm takes rows [tokens, width] or heads [tokens, heads, head_dim]");
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == dtype, "out must have x's shape and dtype");
  const int64_t width = x.size(-1);
  TORCH_CHECK(weight.numel() == width && weight.is_contiguous(), "the weight must be contiguous [", width, "]");
  TORCH_CHECK(x.stride(-1) == 1 && out.stride(-1) == 1, "each row's values must be contiguous");
  const bool heads = x.dim() == 3;
  return RowNorms{x.data_ptr(), out.data_ptr(), weight.data_ptr(), x.size(0), heads ? x.size(1) : 1, width,
                  x.stride(0), heads ? x.stride(1) : 0, out.stride(0), heads ? out.stride(1) : 0,
                  static_cast<float>(eps), dtype == at::kFloat,
                  weight.scalar_type() == at::kFloat && dtype != at::kFloat};
}

void run_rows(const RowNorms& norms) {
  at::parallel_for(0, norms.units(), 16, [&](int64_t begin, int64_t end) { norms.run(begin, end); });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2, "rms_norm takes rows [tokens, width]");
  const at::Tensor xc = x.stride(-1) == 1 ? x : x.contiguous();
  at::Tensor out = at::empty(xc.sizes(), xc.options());
  run_rows(row_norms(xc, weight, eps, out));
  return out;
}

// The `_into` form writes into `out` (what the plain form would return): a replayed step's planned buffer.
void rms_norm_into(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
  TORCH_CHECK(x.dim() == 2, "rms_norm takes rows [tokens, width]");
  run_rows(row_norms(x.stride(-1) == 1 ? x : x.contiguous(), weight, eps, out));
}

// Each head of x [tokens, heads, head_dim] (tokens and heads may be strided: columns of a fused QKV product), in
// place.
void rms_norm_heads_(at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 3, "rms_norm_heads_ takes [tokens, heads, head_dim]");
  run_rows(row_norms(x, weight, eps, x));
}

const frame_cpu::RegisterDirect direct_rms_norm("frame_cpu::rms_norm_into", [](const c10::IValue* const* a) {
  rms_norm_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toDouble(), frame_cpu::written(a[3]));
});
const frame_cpu::RegisterDirect direct_rms_norm_heads("frame_cpu::rms_norm_heads_", [](const c10::IValue* const* a) {
  rms_norm_heads_(frame_cpu::written(a[0]), a[1]->toTensor(), a[2]->toDouble());
});

// The bound forms (direct_ops.h): the checked pointers, each thread of a team normalising its share of the rows.
const frame_cpu::RegisterBind bind_rms_norm("frame_cpu::rms_norm_into",
                                            [](const c10::IValue* const* a, frame_cpu::BoundCall& call) {
  const at::Tensor& x = a[0]->toTensor();
  if (x.dim() != 2 || x.stride(-1) != 1) return false;
  frame_cpu::bind_shares(call, row_norms(x, a[1]->toTensor(), a[2]->toDouble(), a[3]->toTensor()));
  return true;
}, frame_cpu::Stretch::kJoins);

const frame_cpu::RegisterBind bind_rms_norm_heads("frame_cpu::rms_norm_heads_",
                                                  [](const c10::IValue* const* a, frame_cpu::BoundCall& call) {
  const at::Tensor& x = a[0]->toTensor();
  if (x.dim() != 3) return false;
  frame_cpu::bind_shares(call, row_norms(x, a[1]->toTensor(), a[2]->toDouble(), x));
  return true;
}, frame_cpu::Stretch::kJoins);

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rms_norm_into(Tensor x, Tensor weight, float eps, Tensor(a!) out) -> ()");
  m.def("rms_norm_heads_(Tensor(a!) x, Tensor weight, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rms_norm_into", &rms_norm_into);
  m.impl("rms_norm_heads_", &rms_norm_heads_);
}
