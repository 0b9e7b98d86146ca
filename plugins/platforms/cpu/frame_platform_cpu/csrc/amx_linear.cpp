// y = x W^T (+ b) for bfloat16 x on AMX tiles (Sapphire Rapids and later), over the very weight packed_linear.cpp
// reads: panels of 32 output columns, each holding the columns' two weights side by side for every pair of inputs,
// [n / 32][k / 2][32][2]. That is AMX's own layout for the second operand of `tdpbf16ps` (16 rows of input pairs x
// 16 columns x 2), so one panel's columns 0-15 and 16-31 load as two tiles with a row stride of 128 bytes, and
// nothing is repacked.
//
// Why: on an AMX CPU `vdpbf16ps` runs at a fraction of the tiles' rate (2 cores of a Xeon with AMX: 233 GFLOP/s
// for the AVX-512 BF16 packed kernel, 2.9 TFLOP/s for oneDNN on AMX at 4,096 rows; benchmarks/gemm_shapes.py).
//
// A block of 32 rows x 32 columns keeps four 16 x 16 float32 accumulator tiles (0-3) over the whole of k, loading
// two tiles of x (4, 5) and two of the weight (6, 7) per 32 inputs. A thread takes its panels a group of 512 KB at
// a time, which stays in L2 while every block of rows passes over it, and a block's x stays in L1 across the
// group. Each block's epilogue (bias, rounding, SwiGLU) runs after the next block's tile instructions are issued,
// so the vector code overlaps the tiles' work: that alone took the gate-up shape from 1.0-1.2 to 1.6-1.9 TFLOP/s.
// The last, partial block of rows is copied into a zero-padded buffer, so every tile is whole. Every row runs the
// same instructions in the same order whatever the number of rows (even one: a decode row costs a padded tile,
// but a decode step is bound by reading the weight), so a row's result does not depend on its batch.
//
// `amx_swiglu` is the same product over a SwiGLU [gate | up] weight packed as packed_swiglu's (16 gate columns
// then the 16 matching up columns per panel), with the activation in the epilogue (swiglu.h).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "amx_tiles.h"
#include "swiglu.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kPanel = 32;     // output columns per packed panel
constexpr int64_t kBlockRows = 32;  // rows per block: two tiles of x
constexpr int64_t kGroupBytes = 512 << 10;  // weight bytes of the panels a thread keeps in L2 (of 2 MB) at once
constexpr int64_t kStep = 32;       // inputs per tile step: 16 pairs

#if FRAME_AMX && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define FRAME_AMX_BF16 1

// The accumulators of one block: rows x 16 * Cols columns of x[rows, k] against a panel whose pairs rows are
// 32 * Cols bfloat16 wide, stored into c [32][32] float32.
template <int Rows, int Cols>
void block(const uint16_t* x, int64_t k, const uint16_t* panel, float* c) {
  const int64_t x_stride = k * 2;           // bytes from one row of x to the next
  constexpr int64_t w_stride = Cols * 64;   // bytes from one pair of inputs to the next in the panel
  _tile_zero(0);
  if constexpr (Cols == 2) _tile_zero(1);
  if constexpr (Rows == 2) _tile_zero(2);
  if constexpr (Rows == 2 && Cols == 2) _tile_zero(3);
  for (int64_t kk = 0; kk < k; kk += kStep) {
    const uint16_t* w = panel + kk * Cols * 16;  // pair kk / 2, column 0
    _tile_loadd(6, w, w_stride);
    if constexpr (Cols == 2) _tile_loadd(7, w + 32, w_stride);
    _tile_loadd(4, x + kk, x_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (Cols == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (Rows == 2) {
      _tile_loadd(5, x + 16 * k + kk, x_stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (Cols == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int64_t c_stride = kPanel * sizeof(float);
  _tile_stored(0, c, c_stride);
  if constexpr (Cols == 2) _tile_stored(1, c + 16, c_stride);
  if constexpr (Rows == 2) _tile_stored(2, c + 16 * kPanel, c_stride);
  if constexpr (Rows == 2 && Cols == 2) _tile_stored(3, c + 16 * kPanel + 16, c_stride);
}

// c's first `rows` rows plus the bias, rounded once to bfloat16 (gated: silu(gate) * up) into y.
void epilogue(const float* c, int64_t rows, int cols, bool gated, const float* bias, uint16_t* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v[2];
    for (int j = 0; j < cols; ++j) {
      v[j] = _mm512_load_ps(c + r * kPanel + 16 * j);
      if (bias != nullptr) v[j] = _mm512_add_ps(v[j], _mm512_loadu_ps(bias + 16 * j));
    }
    if (gated) {
      const __m256i out = frame_cpu::swiglu16(frame_cpu::round_to_bf16(v[0]), frame_cpu::round_to_bf16(v[1]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * ldy), out);
    } else {
      for (int j = 0; j < cols; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * ldy + 16 * j), frame_cpu::narrow16(v[j]));
    }
  }
}

void run_block(int64_t rows, int cols, const uint16_t* x, int64_t k, const uint16_t* panel, float* c) {
  if (cols == 2) {
    rows > 16 ? block<2, 2>(x, k, panel, c) : block<1, 2>(x, k, panel, c);
  } else {
    rows > 16 ? block<2, 1>(x, k, panel, c) : block<1, 1>(x, k, panel, c);
  }
}
#endif

at::Tensor amx_product(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t n, bool gated) {
#if FRAME_AMX_BF16
  TORCH_CHECK(frame_cpu::amx_permitted(), "Linux did not grant this process AMX's tile state (kernel 5.16+ needed)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16 && x.dim() == 2,
              "amx_linear takes a bfloat16 x [rows, in_features] and a bfloat16 packed weight");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1);
  TORCH_CHECK(k % kStep == 0 && n % (gated ? kPanel : 16) == 0 && packed.numel() == n * k,
              "amx_linear needs in_features a multiple of 32 and out_features a multiple of 16 (of 32 for SwiGLU), "
              "and a weight packed by frame_platform_cpu.kernels");
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "bias must be float32 with out_features elements, ordered as the packed weight's columns");
    bias_ptr = bias->data_ptr<float>();
  }
  const int64_t width = gated ? n / 2 : n;
  at::Tensor y = at::empty({m, width}, xc.options());
  if (m == 0) return y;
  const at::Tensor pc = packed.contiguous();
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<c10::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(pc.data_ptr<c10::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<c10::BFloat16>());
  // The last block's rows, zero-padded to whole tiles.
  const int64_t whole = m / kBlockRows * kBlockRows;
  std::vector<uint16_t> tail;
  if (whole < m) {
    tail.assign(kBlockRows * k, 0);
    std::memcpy(tail.data(), xp + whole * k, (m - whole) * k * sizeof(uint16_t));
  }
  const int64_t panels = (n + kPanel - 1) / kPanel;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    frame_cpu::TileScope tiles;
    alignas(64) float c[2][kBlockRows * kPanel];
    // The epilogue of each block runs after the next block's tile instructions are issued, so that the vector
    // code overlaps the tiles' work instead of waiting for it.
    struct Pending { const float* c; int64_t rows; int cols; const float* bias; uint16_t* out; };
    Pending pending{nullptr, 0, 0, nullptr, nullptr};
    int which = 0;
    auto finish = [&]() {
      if (pending.out != nullptr) epilogue(pending.c, pending.rows, pending.cols, gated, pending.bias, pending.out, width);
      pending.out = nullptr;
    };
    auto one = [&](int64_t p, int64_t r) {
      const int64_t col = p * kPanel;
      const int cols = n - col >= kPanel ? 2 : 1;
      const int64_t rows = std::min(kBlockRows, m - r);
      run_block(rows, cols, r < whole ? xp + r * k : tail.data(), k, wp + col * k, c[which]);
      finish();
      pending = {c[which], rows, cols, bias_ptr ? bias_ptr + col : nullptr, yp + (gated ? p * 16 : col) + r * width};
      which ^= 1;
    };
    // Panels a group at a time, each group's weight (kGroupBytes) kept in L2 while every block of rows passes
    // over it; a block's x (32 rows) stays in L1 across the group's panels.
    const int64_t group = std::max<int64_t>(1, kGroupBytes / (kPanel * k * 2));
    for (int64_t g = begin; g < end; g += group) {
      const int64_t g_end = std::min(end, g + group);
      for (int64_t r = 0; r < m; r += kBlockRows)
        for (int64_t p = g; p < g_end; ++p) one(p, r);
    }
    finish();
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
  m.def("amx_swiglu(Tensor x, Tensor packed, Tensor? bias, int intermediate) -> Tensor");
  m.def("amx_available() -> bool", &amx_available);
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("amx_linear", &amx_linear);
  m.impl("amx_swiglu", &amx_swiglu);
}
