// Gated activations in one pass over rows [gate | up]: SwiGLU's silu(gate) * up and GeGLU's gelu_tanh(gate) * up
// (Gemma's), bfloat16 or float32.
//
// bfloat16 rounds where torch's two bfloat16 ops do (the activation's result to bfloat16, then the product). Both
// activations are gate / (1 + exp(-z)) in float32 with a polynomial exp (swiglu.h): z = gate for silu, and for GELU's
// tanh form, 0.5 x (1 + tanh(y)) = x sigmoid(2y), z = 2 sqrt(2/pi) (gate + 0.044715 gate^3). So a value may land
// one bfloat16 step from torch's now and then (GeGLU's far negative tail, where torch's form cancels, more often);
// float32 stays float32 throughout. Rows (a lone row: its columns) are split over torch's intra-op threads, or over
// a step program's team (the bound forms).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "bfloat16_bits.h"
#include "direct_ops.h"
#include "swiglu.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

using frame_cpu::bf16_to_float;
using frame_cpu::float_to_bf16;

enum class Gate : int { kSilu, kGeluTanh };

// One row's act(gate) * up in bfloat16, each product rounded as torch's two ops round it.
template <bool Gelu>
void gated_row(const uint16_t* gate, const uint16_t* up, uint16_t* dst, int64_t width) {
#if FRAME_AVX512_BF16_BITS
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 mask = frame_cpu::tail_mask16(width - i);
    _mm256_mask_storeu_epi16(
        dst + i, mask, frame_cpu::gated16<Gelu>(frame_cpu::load16(gate + i, mask), frame_cpu::load16(up + i, mask)));
  }
#else
  for (int64_t i = 0; i < width; ++i) {
    const float act = bf16_to_float(float_to_bf16(frame_cpu::gate_act<Gelu>(bf16_to_float(gate[i]))));
    dst[i] = float_to_bf16(act * bf16_to_float(up[i]));
  }
#endif
}

// One call's rows, checked and resolved to pointers, in pieces of at most kPiece columns: a lone decode row still
// splits over a team.
struct Activation {
  static constexpr int64_t kPiece = 256;
  const void* x;
  void* out;
  int64_t rows, width, pieces;
  bool f32;
  Gate gate;

  int64_t units() const { return rows * pieces; }

  void run(int64_t begin, int64_t end) const {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t r = u / pieces, c = (u % pieces) * kPiece, n = std::min(kPiece, width - c);
      if (f32) {
        const float* g = static_cast<const float*>(x) + r * 2 * width + c;
        float* o = static_cast<float*>(out) + r * width + c;
        if (gate == Gate::kSilu) frame_cpu::gated_f32<false>(g, g + width, o, n);
        else frame_cpu::gated_f32<true>(g, g + width, o, n);
      } else {
        const uint16_t* g = static_cast<const uint16_t*>(x) + r * 2 * width + c;
        uint16_t* o = static_cast<uint16_t*>(out) + r * width + c;
        if (gate == Gate::kSilu) gated_row<false>(g, g + width, o, n);
        else gated_row<true>(g, g + width, o, n);
      }
    }
  }
};

// Checks x (contiguous bfloat16 or float32 [rows, 2 * width]) and out ([rows, width] of x's dtype).
Activation activation(const at::Tensor& x, const at::Tensor& out, Gate gate = Gate::kSilu) {
  TORCH_CHECK((x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat) && x.dim() == 2 &&
                  x.size(1) % 2 == 0 && x.is_contiguous(),
              "silu_and_mul and gelu_tanh_and_mul take bfloat16 or float32 [rows, 2 * width]");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  TORCH_CHECK(out.dim() == 2 && out.size(0) == rows && out.size(1) == width && out.is_contiguous() &&
                  out.scalar_type() == x.scalar_type(),
              "out must be a contiguous [rows, width] tensor of x's dtype");
  const int64_t pieces = std::max<int64_t>(1, (width + Activation::kPiece - 1) / Activation::kPiece);
  return Activation{x.data_ptr(), out.data_ptr(), rows, width, pieces, x.scalar_type() == at::kFloat, gate};
}

void run_activation(const Activation& act) {
  at::parallel_for(0, act.units(), std::max<int64_t>(1, 16384 / Activation::kPiece),
                   [&](int64_t begin, int64_t end) { act.run(begin, end); });
}

at::Tensor act_and_mul(const at::Tensor& x, Gate gate) {
  const at::Tensor xc = x.contiguous();
  TORCH_CHECK(xc.dim() == 2, "silu_and_mul and gelu_tanh_and_mul take bfloat16 or float32 [rows, 2 * width]");
  at::Tensor out = at::empty({xc.size(0), xc.size(1) / 2}, xc.options());
  run_activation(activation(xc, out, gate));
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& x) { return act_and_mul(x, Gate::kSilu); }
at::Tensor gelu_tanh_and_mul(const at::Tensor& x) { return act_and_mul(x, Gate::kGeluTanh); }

// The `_into` forms write into `out` (what the plain form would return): a replayed step's planned buffer.
void silu_and_mul_into(const at::Tensor& x, at::Tensor& out) {
  run_activation(activation(x.contiguous(), out, Gate::kSilu));
}
void gelu_tanh_and_mul_into(const at::Tensor& x, at::Tensor& out) {
  run_activation(activation(x.contiguous(), out, Gate::kGeluTanh));
}

const frame_cpu::RegisterDirect direct_silu_and_mul("frame_cpu::silu_and_mul_into", [](const c10::IValue* const* a) {
  silu_and_mul_into(a[0]->toTensor(), frame_cpu::written(a[1]));
});
const frame_cpu::RegisterDirect direct_gelu_tanh_and_mul("frame_cpu::gelu_tanh_and_mul_into",
                                                         [](const c10::IValue* const* a) {
  gelu_tanh_and_mul_into(a[0]->toTensor(), frame_cpu::written(a[1]));
});

// The bound forms (direct_ops.h): each thread of a team takes its share of the pieces.
template <Gate kGate>
bool bind_activation(const c10::IValue* const* a, frame_cpu::BoundCall& call) {
  if (!a[0]->toTensor().is_contiguous()) return false;
  frame_cpu::bind_shares(call, activation(a[0]->toTensor(), a[1]->toTensor(), kGate));
  return true;
}

const frame_cpu::RegisterBind bind_silu_and_mul("frame_cpu::silu_and_mul_into", &bind_activation<Gate::kSilu>,
                                                frame_cpu::Stretch::kJoins);
const frame_cpu::RegisterBind bind_gelu_tanh_and_mul("frame_cpu::gelu_tanh_and_mul_into",
                                                     &bind_activation<Gate::kGeluTanh>, frame_cpu::Stretch::kJoins);

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("silu_and_mul_into(Tensor x, Tensor(a!) out) -> ()");
  m.def("gelu_tanh_and_mul(Tensor x) -> Tensor");
  m.def("gelu_tanh_and_mul_into(Tensor x, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("silu_and_mul_into", &silu_and_mul_into);
  m.impl("gelu_tanh_and_mul", &gelu_tanh_and_mul);
  m.impl("gelu_tanh_and_mul_into", &gelu_tanh_and_mul_into);
}
