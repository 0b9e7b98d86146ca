// y = x W^T (+ b) for bfloat16 x and a weight packed once into column panels of AVX-512 BF16 pairs: every bfloat16
// linear of the model, from one row (a single decode) to a prefill chunk's thousands.
//
// oneDNN's blocked GEMM reaches about 420 GFLOP/s on this kind of CPU at 256 rows but only about 340 at 64: at
// that size its fixed costs and blocking are not amortised. This kernel is one register tile and nothing else,
// and matched or beat oneDNN at every row count measured (benchmarks/gemm_shapes.py).
// The weight is packed as panels of 32 output columns; a panel holds, for each pair of input features, the 32
// columns' two weights side by side: [n / 32][k / 2][32][2]. One `vdpbf16ps` then multiplies a broadcast pair of
// x by 16 columns' pairs. A tile of up to 14 rows x 32 columns keeps its 28 float32 accumulators in registers over
// the whole of k and rounds them to bfloat16 once, at the end, as torch does. A panel is read from memory once and
// from cache for each further row tile, which meanwhile asks for the thread's next panel; panels are split over
// torch's intra-op threads, and a prefill's rows are taken a block at a time (x in L2) across all of them.
//
// Each output is one float32 sum over k in the same order whatever the number of rows, so a row's result does not
// depend on what it is batched with.
//
// `packed_swiglu` is the same product for SwiGLU's [gate | up] weight packed so that each panel holds 16 gate
// columns and the 16 matching up columns (`pack_swiglu_weight`): the epilogue rounds both to bfloat16, as the
// matmul's output would be, and stores silu(gate) * up (swiglu.h), so the twice-as-wide product never reaches
// memory. The result has the same bits as the matmul followed by the `silu_and_mul` kernel.
//
// `packed_linear_float` keeps the float32 sums (plus bias) unrounded: the output projection's logits, which the
// sampler takes in float32, so no bfloat16 copy of them is stored and widened again (amx_linear_float on AMX).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "direct_ops.h"
#include "swiglu.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "panel_prefetch.h"
#endif

namespace {

constexpr int64_t kPanel = 32;  // output columns per packed panel: two zmm registers of float32 accumulators
constexpr int kRowTile = 14;    // rows per register tile: 14 x 2 accumulators, two weight registers, one broadcast
constexpr int64_t kRowBlockBytes = 256 * 1024;  // x rows per pass over the panels: a quarter of a Zen 4/5 L2
// A tile of fewer rows than this reads each weight line once, for this step only (a decode): it asks for the line
// kStreamAhead bytes on as non-temporal (prefetchnta), so the weights, which stream through the caches every step,
// stop evicting what the step's other work keeps there (the engine's Python, the dispatcher, the KV). Measured on a
// Zen 4 (SmolLM2 bfloat16 single stream, one process, 10 rounds alternating with the hint off): the time a token
// spends outside the replayed step fell from 0.72 to 0.62 ms (medians) and the token was faster in 9 of 10 rounds;
// 1 KiB ahead was no better than none. The prefetch is ahead of the loads by two steps only: the hint, not the
// distance, is the point.
constexpr int kStreamRows = 8;
constexpr int64_t kStreamAhead = 256;
constexpr int64_t kDecodeChunksPerThread = 2;

#if defined(__AVX512BF16__)
inline __m512bh broadcast_pair(const uint16_t* x) {
  int32_t pair;
  std::memcpy(&pair, x, sizeof pair);
  return (__m512bh)_mm512_set1_epi32(pair);
}

// What a tile stores: bfloat16 (rounded once), SwiGLU's silu(gate) * up in bfloat16, or the float32 sums.
enum class Out { kBf16, kGated, kFloat };

// y[r, 0:16*C] for R rows: C is 2 for a whole panel, 1 for a trailing 16-column one. Gated: y[r, 0:16] is
// silu(columns 0-15) * (columns 16-31). `y` is uint16_t (bfloat16 bits) or, for Out::kFloat, float.
// `ahead_lines` lines from `ahead` (part of the next panel) are asked into L1, spread evenly over the pairs of k.
template <int R, int C, Out O>
void tile(const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t pairs, const float* bias, void* y,
          int64_t ldy, const char* ahead, int64_t ahead_lines) {
  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  frame_cpu::steps_with_prefetch(pairs, ahead, ahead_lines, [&](int64_t p) __attribute__((always_inline)) {
    if constexpr (R < kStreamRows) {
#pragma GCC unroll 2
      for (int c = 0; c < C; ++c)
        _mm_prefetch(reinterpret_cast<const char*>(panel + (p * C + c) * 32) + kStreamAhead, _MM_HINT_NTA);
    }
    __m512bh w[C];
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) w[c] = (__m512bh)_mm512_loadu_si512(panel + (p * C + c) * 32);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh a = broadcast_pair(x + r * ldx + 2 * p);
#pragma GCC unroll 2
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, w[c]);
    }
  });
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c)
      if (bias != nullptr) acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_loadu_ps(bias + 16 * c));
    if constexpr (O == Out::kGated) {
      static_assert(C == 2, "a gated panel holds 16 gate and 16 up columns");
      const __m256i out = frame_cpu::swiglu16(frame_cpu::round_to_bf16(acc[r][0]), frame_cpu::round_to_bf16(acc[r][1]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(y) + r * ldy), out);
    } else if constexpr (O == Out::kFloat) {
#pragma GCC unroll 2
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(static_cast<float*>(y) + r * ldy + 16 * c, acc[r][c]);
    } else {
#pragma GCC unroll 2
      for (int c = 0; c < C; ++c)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(y) + r * ldy + 16 * c),
                            frame_cpu::narrow16(acc[r][c]));
    }
  }
}

template <int C, Out O>
void tile_rows(int rows, const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t pairs, const float* bias,
               void* y, int64_t ldy, const char* ahead, int64_t ahead_lines) {
  switch (rows) {
#define FRAME_TILE_CASE(R) \
  case R: tile<R, C, O>(x, ldx, panel, pairs, bias, y, ldy, ahead, ahead_lines); break;
    FRAME_TILE_CASE(1) FRAME_TILE_CASE(2) FRAME_TILE_CASE(3) FRAME_TILE_CASE(4) FRAME_TILE_CASE(5)
    FRAME_TILE_CASE(6) FRAME_TILE_CASE(7) FRAME_TILE_CASE(8) FRAME_TILE_CASE(9) FRAME_TILE_CASE(10)
    FRAME_TILE_CASE(11) FRAME_TILE_CASE(12) FRAME_TILE_CASE(13) FRAME_TILE_CASE(14)
#undef FRAME_TILE_CASE
    default: TORCH_CHECK(false, "row tile of ", rows);
  }
}

// Every row of x against one panel of C x 16 columns, kRowTile rows at a time; y has rows of ldy. The later row
// tiles ask for `next_lines` lines of the thread's next panel (panel_prefetch.h).
template <int C, Out O, typename T>
void panel_product(const uint16_t* x, int64_t m, int64_t k, const uint16_t* panel, const float* bias, T* y,
                   int64_t ldy, const char* next, int64_t next_lines) {
  const int64_t tiles = (m + kRowTile - 1) / kRowTile;
  for (int64_t t = 0, r = 0; r < m; ++t, r += kRowTile) {
    const int rows = static_cast<int>(std::min<int64_t>(kRowTile, m - r));
    const frame_cpu::PrefetchShare share = frame_cpu::prefetch_share(next_lines, m, tiles, t);
    tile_rows<C, O>(rows, x + r * k, k, panel, k / 2, bias, y + r * ldy, ldy, next + 64 * share.first,
                    share.count);
  }
}
#endif

#if defined(__AVX512BF16__)
// One product's operands as pointers, and its panels: `run(begin, end)` computes panels [begin, end) for every row.
struct Product {
  const uint16_t* x;
  const uint16_t* weight;
  const float* bias;
  uint16_t* y;  // bfloat16 out (y_float null)
  float* y_float;
  int64_t m, k, n, width, panels, block_rows;
  bool gated;

  void run(int64_t begin, int64_t end) const {
    // Rows in blocks whose x fits in L2 beside the panels (kRowBlockBytes): a prefill chunk's x (thousands of rows)
    // would otherwise stream from L3 once per panel.
    for (int64_t r0 = 0; r0 < m; r0 += block_rows) {
      const int64_t rows = std::min<int64_t>(block_rows, m - r0);
      const uint16_t* xb = x + r0 * k;
      uint16_t* yb = y_float ? nullptr : y + r0 * width;
      float* yfb = y_float ? y_float + r0 * width : nullptr;
      for (int64_t p = begin; p < end; ++p) {
        const int64_t col = p * kPanel;
        const uint16_t* panel = weight + col * k;
        const float* panel_bias = bias ? bias + col : nullptr;
        // Lines of this thread's next panel, when it has one.
        const int64_t lines = p + 1 < end ? std::min<int64_t>(kPanel, n - col - kPanel) * k * 2 / 64 : 0;
        const char* next = lines > 0 ? reinterpret_cast<const char*>(panel + kPanel * k) : nullptr;
        const bool whole = n - col >= kPanel;
        if (gated) panel_product<2, Out::kGated>(xb, rows, k, panel, panel_bias, yb + p * 16, width, next, lines);
        else if (y_float && whole) panel_product<2, Out::kFloat>(xb, rows, k, panel, panel_bias, yfb + col, width, next, lines);
        else if (y_float) panel_product<1, Out::kFloat>(xb, rows, k, panel, panel_bias, yfb + col, width, next, lines);
        else if (whole) panel_product<2, Out::kBf16>(xb, rows, k, panel, panel_bias, yb + col, width, next, lines);
        else panel_product<1, Out::kBf16>(xb, rows, k, panel, panel_bias, yb + col, width, next, lines);
      }
    }
  }
};

// Checks the operands (x and packed contiguous, y of the product's shape and dtype) and points a Product at them.
// `bias`: null for none. Only references are taken, no tensor handle (a team's threads share the reference counts).
Product make_product(const at::Tensor& x, const at::Tensor& packed, const at::Tensor* bias, int64_t n, bool gated,
                     bool float_out, const at::Tensor& y) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
              "packed_linear takes a bfloat16 x and a bfloat16 packed weight");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "packed_linear takes x of shape [rows, in_features]");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % 2 == 0 && n % (gated ? kPanel : 16) == 0 && packed.numel() == n * k && packed.is_contiguous(),
              "the packed weight must hold out_features x in_features, with an even in_features and out_features "
              "a multiple of 16 (of 32 for SwiGLU); pack it with frame_platform_cpu.kernels");
  const float* bias_ptr = nullptr;
  if (bias != nullptr && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "bias must be float32 with out_features elements, ordered as the packed weight's columns");
    bias_ptr = bias->data_ptr<float>();
  }
  const int64_t width = gated ? n / 2 : n;
  TORCH_CHECK(y.dim() == 2 && y.size(0) == m && y.size(1) == width && y.is_contiguous() &&
                  y.scalar_type() == (float_out ? at::kFloat : at::kBFloat16),
              "out must be a contiguous [rows, out_features] tensor of the product's dtype");
  Product product;
  product.x = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  product.weight = reinterpret_cast<const uint16_t*>(packed.data_ptr<c10::BFloat16>());
  product.bias = bias_ptr;
  product.y = float_out ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr<c10::BFloat16>());
  product.y_float = float_out ? y.data_ptr<float>() : nullptr;
  product.m = m;
  product.k = k;
  product.n = n;
  product.width = width;
  product.panels = (n + kPanel - 1) / kPanel;  // the last one has 16 columns when n is an odd multiple of 16
  product.block_rows = std::max<int64_t>(kRowTile, kRowBlockBytes / (2 * k) / kRowTile * kRowTile);
  product.gated = gated;
  return product;
}
#endif

// x [m, k] against a packed weight of n columns: y [m, n], or [m, n / 2] when gated; float32 when float_out.
// `into`: a tensor of that shape and dtype to write y into (a recorded step's planned buffer), else a new one.
at::Tensor packed_product(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                          int64_t n, bool gated, bool float_out = false, const at::Tensor* into = nullptr) {
#if defined(__AVX512BF16__)
  TORCH_CHECK(x.dim() == 2, "packed_linear takes x of shape [rows, in_features]");
  const at::Tensor xc = x.contiguous(), pc = packed.contiguous();
  const at::Tensor y = into != nullptr ? *into
                                       : at::empty({xc.size(0), gated ? n / 2 : n},
                                                   xc.options().dtype(float_out ? at::kFloat : at::kBFloat16));
  const Product product = make_product(xc, pc, bias.has_value() ? &*bias : nullptr, n, gated, float_out, y);
  if (product.m == 0) return y;
  const int64_t panels = product.panels;
  auto run_panels = [&](int64_t begin, int64_t end) { product.run(begin, end); };
  const int64_t threads = at::get_num_threads();
  if (product.m < kStreamRows && threads > 1) {
    // A decode's panels go out in a few chunks per thread, taken as threads come free, rather than one fixed half
    // each: a thread that starts late (woken, or on a busier link to memory) no longer keeps the other waiting at
    // the end. Zen 4, SmolLM2 single stream, one process alternating with the fixed split: faster in 7 of 8
    // rounds, by 2-4%; 4 or 8 chunks a thread were no better than 2.
    const int64_t chunk = std::max<int64_t>(1, panels / (kDecodeChunksPerThread * threads));
    std::atomic<int64_t> next_chunk{0};
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t c = next_chunk.fetch_add(1); c * chunk < panels; c = next_chunk.fetch_add(1))
          run_panels(c * chunk, std::min(panels, (c + 1) * chunk));
    });
  } else {
    at::parallel_for(0, panels, 1, run_panels);
  }
  return y;
#else
  TORCH_CHECK(false, "packed_linear needs a CPU with AVX-512 BF16; this build has no such instructions");
#endif
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                         int64_t out_features) {
  return packed_product(x, packed, bias, out_features, false);
}

at::Tensor packed_linear_float(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                               int64_t out_features) {
  return packed_product(x, packed, bias, out_features, false, true);
}

at::Tensor packed_swiglu(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                         int64_t intermediate) {
  return packed_product(x, packed, bias, 2 * intermediate, true);
}

// The `_into` forms write into `out` (the shape and dtype the plain form would return): a replayed decode step
// keeps its intermediates in buffers planned once (replay.py), so a step allocates and frees none of them.
void packed_linear_into(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                        int64_t out_features, at::Tensor& out) {
  packed_product(x, packed, bias, out_features, false, false, &out);
}

void packed_linear_float_into(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                              int64_t out_features, at::Tensor& out) {
  packed_product(x, packed, bias, out_features, false, true, &out);
}

void packed_swiglu_into(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                        int64_t intermediate, at::Tensor& out) {
  packed_product(x, packed, bias, 2 * intermediate, true, false, &out);
}

using frame_cpu::RegisterDirect;
using frame_cpu::written;
const RegisterDirect direct_linear("frame_cpu::packed_linear_into", [](const c10::IValue* const* a) {
  packed_linear_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toOptional<at::Tensor>(), a[3]->toInt(), written(a[4]));
});
const RegisterDirect direct_linear_float("frame_cpu::packed_linear_float_into", [](const c10::IValue* const* a) {
  packed_linear_float_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toOptional<at::Tensor>(), a[3]->toInt(),
                           written(a[4]));
});
const RegisterDirect direct_swiglu("frame_cpu::packed_swiglu_into", [](const c10::IValue* const* a) {
  packed_swiglu_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toOptional<at::Tensor>(), a[3]->toInt(), written(a[4]));
});

#if defined(__AVX512BF16__)
// Bound forms (direct_ops.h): the checked Product, each thread running its contiguous share of the panels from it
// into the planned buffer.
bool bind_product(const c10::IValue* const* a, frame_cpu::BoundCall& call, bool gated, bool float_out) {
  if (!a[0]->toTensor().is_contiguous()) return false;
  const int64_t n = gated ? 2 * a[3]->toInt() : a[3]->toInt();
  call.as<Product>() = make_product(a[0]->toTensor(), a[1]->toTensor(), a[2]->isNone() ? nullptr : &a[2]->toTensor(),
                                    n, gated, float_out, a[4]->toTensor());
  call.shared = true;
  call.run = [](const frame_cpu::BoundCall& bound, const frame_cpu::Team& team) {
    const Product& product = bound.as<Product>();
    const auto [begin, end] = frame_cpu::share(product.panels, team);
    if (product.m > 0 && begin < end) product.run(begin, end);
  };
  return true;
}

const frame_cpu::RegisterBind bind_linear("frame_cpu::packed_linear_into",
    [](const c10::IValue* const* a, frame_cpu::BoundCall& call) { return bind_product(a, call, false, false); },
    frame_cpu::Stretch::kAnchors);
const frame_cpu::RegisterBind bind_linear_float("frame_cpu::packed_linear_float_into",
    [](const c10::IValue* const* a, frame_cpu::BoundCall& call) { return bind_product(a, call, false, true); },
    frame_cpu::Stretch::kAnchors);
const frame_cpu::RegisterBind bind_swiglu("frame_cpu::packed_swiglu_into",
    [](const c10::IValue* const* a, frame_cpu::BoundCall& call) { return bind_product(a, call, true, false); },
    frame_cpu::Stretch::kAnchors);
#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("packed_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("packed_linear_float(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("packed_swiglu(Tensor x, Tensor packed, Tensor? bias, int intermediate) -> Tensor");
  m.def("packed_linear_into(Tensor x, Tensor packed, Tensor? bias, int out_features, Tensor(a!) out) -> ()");
  m.def("packed_linear_float_into(Tensor x, Tensor packed, Tensor? bias, int out_features, Tensor(a!) out) -> ()");
  m.def("packed_swiglu_into(Tensor x, Tensor packed, Tensor? bias, int intermediate, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("packed_linear", &packed_linear);
  m.impl("packed_linear_float", &packed_linear_float);
  m.impl("packed_swiglu", &packed_swiglu);
  m.impl("packed_linear_into", &packed_linear_into);
  m.impl("packed_linear_float_into", &packed_linear_float_into);
  m.impl("packed_swiglu_into", &packed_swiglu_into);
}
