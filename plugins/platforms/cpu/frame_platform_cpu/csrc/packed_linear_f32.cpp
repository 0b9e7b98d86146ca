// y = x W^T (+ b) for a float32 or bfloat16 weight packed once into 16-column panels, on float32 FMAs: every
// float32 linear of the model on x86 CPUs, and every bfloat16 one on those without AVX-512 BF16 (AVX-512 Xeons
// before Cooper Lake, AVX2-only parts such as AMD Zen 2/3): bfloat16 is storage only on such CPUs (half the bytes
// a decode step reads), each weight widened to float32 in registers (exact) and every product and sum in float32.
//
// torch's float32 F.linear goes to MKL, whose matrix-vector path streams the weight once per call, but whose GEMM
// for 2 to 16 rows (speculative decoding's verification steps, small batches) measured 3x the one-row time on a
// Zen 3 core: fixed costs and packing that a handful of rows cannot amortise. Here the weight is packed once as
// panels of 16 output columns, [n / 16][k][16]: for each input feature, the panel's 16 weights side by side, two
// ymm loads. A tile of up to 6 rows x 16 columns keeps its 12 float32 accumulators in registers over the whole of
// k; each weight pair is loaded once for the whole tile and each input broadcast once per row. A panel is read from
// memory once and from L1/L2 for each further row tile; panels are split over torch's intra-op threads. Where a
// panel takes several row tiles, the first one prefetches the next panel a cache line per k-step: measured at 8
// rows on a Zen 3 core, 66 -> 58 ms a SmolLM2-135M step in float32 and 60 -> 37 ms with bfloat16 weights, because
// the next panel's first pass no longer stalls on memory while nothing overlaps it.
//
// With AVX-512 the tile is up to 14 rows x 32 columns (two panels side by side, one zmm of each per k-step): 28
// accumulators, so each broadcast of x feeds two FMAs and each weight load fourteen, at twice AVX2's width. The
// sums are the AVX2 tile's, step for step.
//
// A bfloat16 weight on AVX-512 (Ice Lake, Cascade Lake: no bfloat16 dot product) is packed with two columns in
// each 32-bit lane: a pair of panels holds, for each input feature, column j in the low half of lane j and column
// 16 + j in the high half, [n / 32][k][16][2]. One 64-byte load then gives 32 weights, and they widen with one
// shift (the low halves) and one AND (the high ones), where the [k][16] layout took two `vpmovzxwd`, which compete
// for one port with the broadcasts of x, and two shifts. A last, odd panel keeps [k][16]. `pack_weight_f32` (this
// file) packs whichever layout this build reads; the sums, and so the bits, are the same either way.
//
// Each output is one float32 sum over k in order, whatever the number of rows, so a row's result does not depend
// on what it is batched with (nor on the ISA: AVX2 and AVX-512 give the same bits).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "direct_ops.h"
#include "linear_bias.h"

namespace {

constexpr int64_t kPanel = 16;  // output columns per packed panel: two ymm registers (one zmm) of float32
#if defined(__AVX512F__)
constexpr int kRowTile = 14;  // rows per register tile: 14 x 2 zmm accumulators, two weights, one broadcast
constexpr bool kBf16PairLanes = true;  // a bfloat16 weight's pairs of panels hold two columns a lane (see the top)
#else
constexpr int kRowTile = 6;  // rows per register tile: 6 x 2 ymm accumulators, two weight registers, one broadcast
constexpr bool kBf16PairLanes = false;
#endif

// Rows a thread takes through all of its panels before the next rows: whole row tiles whose x fits in kXBlockBytes,
// so that x stays in L2 while each panel passes over it. Taking every row through one panel before the next, a
// prefill of 4,096 rows streamed its 9.4 MB of x from L3 again for every panel: SmolLM2's gate-up product ran at
// 151-159 GFLOP/s there against 213-220 at 256 rows (AVX2, two Zen 4 cores). A panel is now read once a block, from
// L3, where x was read once a panel (the AVX-512 BF16 kernel, packed_linear.cpp, blocks its rows the same way).
// Tiles keep their height, and each output its one sum over k in order: the same bits.
constexpr int64_t kXBlockBytes = 256 << 10;

// Row tiles of equal height: 8 rows are two of 4, not 6 and 2, because every tile costs a pass over a panel's weights.
inline int64_t tile_height(int64_t m) {
  const int64_t tiles = (m + kRowTile - 1) / kRowTile;
  return (m + tiles - 1) / tiles;
}

inline int64_t row_block(int64_t m, int64_t k, int64_t height) {
  const int64_t tiles = std::max<int64_t>(1, kXBlockBytes / (k * static_cast<int64_t>(sizeof(float)) * height));
  return std::min(m, tiles * height);
}

// tile<rows>(...) for a run-time row count in [1, kRowTile].
template <int R = 1, typename Tile>
void with_rows(int rows, Tile&& tile) {
  if constexpr (R <= kRowTile) {
    if (rows == R) return tile(std::integral_constant<int, R>{});
    return with_rows<R + 1>(rows, tile);
  } else {
    TORCH_CHECK(false, "row tile of ", rows);
  }
}

#if defined(__AVX512F__)

// Sixteen of a panel's weights as float32: float32 as they are, bfloat16 widened exactly.
inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
inline __m512 load16(const uint16_t* w) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// R rows x C panels (C consecutive panels of [k][16], `panel` the first): y [R, 16 * C] (+ bias). The first row
// tile of a panel pair also asks for the next pair (`ahead`), a line per panel as the k-steps reach it.
template <int R, int C, typename W>
void tile(const float* x, int64_t ldx, const W* panel, int64_t k, const float* bias, float* y, int64_t ldy,
          const W* ahead) {
  __m512 acc[R][C];
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  constexpr int64_t kLineSteps = 64 / (kPanel * sizeof(W));  // k-steps per cache line of a panel
  for (int64_t i = 0; i < k; ++i) {
    if (ahead != nullptr && i % kLineSteps == 0)
#pragma GCC unroll 2
      for (int c = 0; c < C; ++c)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + (c * k + i) * kPanel), _MM_HINT_T0);
    __m512 w[C];
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) w[c] = load16(panel + (c * k + i) * kPanel);
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ldx + i]);
#pragma GCC unroll 2
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(a, w[c], acc[r][c]);
    }
  }
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) {
      if (bias != nullptr) acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_loadu_ps(bias + 16 * c));
      _mm512_storeu_ps(y + r * ldy + 16 * c, acc[r][c]);
    }
}

// R rows x a pair of bfloat16 panels packed two columns a lane ([k][16][2], `pair`): y [R, 32] (+ bias). The first
// row tile of a pair also asks for the next pair (`ahead`), whose k-steps are a cache line each.
constexpr int64_t kPairLead = 16;  // k-steps (cache lines) a pair asks ahead of itself

template <int R>
void pair_tile(const float* x, int64_t ldx, const uint16_t* pair, int64_t k, const float* bias, float* y,
               int64_t ldy, const uint16_t* ahead) {
  __m512 acc[R][2];
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t i = 0; i < k; ++i) {
    if (ahead != nullptr) _mm_prefetch(reinterpret_cast<const char*>(ahead + i * 2 * kPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(pair + (i + kPairLead) * 2 * kPanel), _MM_HINT_T0);
    const __m512i lanes = _mm512_loadu_si512(pair + i * 2 * kPanel);
    const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(lanes, 16));
    const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(lanes, high));
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ldx + i]);
      acc[r][0] = _mm512_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {
      if (bias != nullptr) acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_loadu_ps(bias + 16 * c));
      _mm512_storeu_ps(y + r * ldy + 16 * c, acc[r][c]);
    }
}

template <int C, typename W>
void tile_rows(int rows, const float* x, int64_t ldx, const W* panel, int64_t k, const float* bias, float* y,
               int64_t ldy, const W* ahead) {
  if constexpr (C == 2 && std::is_same_v<W, uint16_t>) {
    with_rows(rows, [&](auto r) { pair_tile<decltype(r)::value>(x, ldx, panel, k, bias, y, ldy, ahead); });
  } else {
    with_rows(rows, [&](auto r) { tile<decltype(r)::value, C, W>(x, ldx, panel, k, bias, y, ldy, ahead); });
  }
}

// The units a product is split in: pairs of panels (a last, odd panel alone).
inline int64_t product_units(int64_t n) { return (n / kPanel + 1) / 2; }

// Pairs [begin, end) of panels against rows [r0, r1) of float32 x (tiles `height` rows high), into float32 y [m, n];
// a last, odd panel alone.
template <typename W>
void product_range(const float* xp, int64_t k, const W* wp, int64_t n, const float* bias_ptr, float* yp,
                   int64_t begin, int64_t end, int64_t r0, int64_t r1, int64_t height) {
  const int64_t panels = n / kPanel;
  for (int64_t p = begin; p < end; ++p) {
    const int64_t col = 2 * p * kPanel;
    const bool two = 2 * p + 1 < panels;
    for (int64_t r = r0; r < r1; r += height) {
      const int rows = static_cast<int>(std::min<int64_t>(height, r1 - r));
      // The next pair, when this thread has one of two panels (a last, odd panel is not asked for ahead).
      const bool next_pair = p + 1 < end && 2 * p + 3 < panels;
      const W* ahead = r == r0 && height < r1 - r0 && next_pair ? wp + (col + 2 * kPanel) * k : nullptr;
      const float* bias = bias_ptr ? bias_ptr + col : nullptr;
      if (two) tile_rows<2, W>(rows, xp + r * k, k, wp + col * k, k, bias, yp + r * n + col, n, ahead);
      else tile_rows<1, W>(rows, xp + r * k, k, wp + col * k, k, bias, yp + r * n + col, n, nullptr);
    }
  }
}
#elif defined(__AVX2__) && defined(__FMA__)

// Eight of a panel's weights as float32: float32 as they are, bfloat16 widened exactly (the top half of a float).
inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const uint16_t* w) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

template <int R, typename W>
void tile(const float* x, int64_t ldx, const W* panel, int64_t k, const float* bias, float* y, int64_t ldy,
          const W* ahead) {
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  constexpr int64_t kLineSteps = 64 / (kPanel * sizeof(W));  // k-steps per cache line of the panel
  for (int64_t i = 0; i < k; ++i) {
    if (ahead != nullptr && i % kLineSteps == 0)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + i * kPanel), _MM_HINT_T0);
    const __m256 w0 = load8(panel + i * kPanel);
    const __m256 w1 = load8(panel + i * kPanel + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + i);
      acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if (bias != nullptr) {
      acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_loadu_ps(bias));
      acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_loadu_ps(bias + 8));
    }
    _mm256_storeu_ps(y + r * ldy, acc[r][0]);
    _mm256_storeu_ps(y + r * ldy + 8, acc[r][1]);
  }
}

template <typename W>
void tile_rows(int rows, const float* x, int64_t ldx, const W* panel, int64_t k, const float* bias, float* y,
               int64_t ldy, const W* ahead) {
  with_rows(rows, [&](auto r) { tile<decltype(r)::value, W>(x, ldx, panel, k, bias, y, ldy, ahead); });
}

// The units a product is split in: panels.
inline int64_t product_units(int64_t n) { return n / kPanel; }

// Panels [begin, end) against rows [r0, r1) of float32 x (tiles `height` rows high), into float32 y [m, n].
template <typename W>
void product_range(const float* xp, int64_t k, const W* wp, int64_t n, const float* bias_ptr, float* yp,
                   int64_t begin, int64_t end, int64_t r0, int64_t r1, int64_t height) {
  for (int64_t p = begin; p < end; ++p) {
    const int64_t col = p * kPanel;
    for (int64_t r = r0; r < r1; r += height) {
      const int rows = static_cast<int>(std::min<int64_t>(height, r1 - r));
      // With more than one row tile, the first one also fetches the next panel, so that panel's first pass
      // computes from the caches instead of waiting on memory (the later passes already do).
      const W* ahead = r == r0 && height < r1 - r0 && p + 1 < end ? wp + (col + kPanel) * k : nullptr;
      tile_rows(rows, xp + r * k, k, wp + col * k, k, bias_ptr ? bias_ptr + col : nullptr, yp + r * n + col, n,
                ahead);
    }
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// One product of float32 x, checked and resolved to pointers: what the plain op's threads, a team's and a bound
// record (direct_ops.h) run, a share of the units each. No tensor handle is taken.
struct F32Product {
  const float* x;
  const void* w;
  const float* bias;
  float* y;
  int64_t m, k, n;
  bool bf16_weight;

  int64_t units() const { return product_units(n); }

  void run(int64_t begin, int64_t end) const {
    if (m == 0 || begin >= end) return;
    // A block of rows at a time through all of this share's panels (row_block).
    const int64_t height = tile_height(m), block = row_block(m, k, height);
    for (int64_t r0 = 0; r0 < m; r0 += block) {
      const int64_t r1 = std::min(m, r0 + block);
      if (bf16_weight)
        product_range(x, k, static_cast<const uint16_t*>(w), n, bias, y, begin, end, r0, r1, height);
      else
        product_range(x, k, static_cast<const float*>(w), n, bias, y, begin, end, r0, r1, height);
    }
  }
};

// Checks the operands: the packed weight (float32, or bfloat16 storage), float32 x [rows, in_features]
// contiguous, y a contiguous float32 [rows, out_features].
F32Product make_f32_product(const at::Tensor& x, const at::Tensor& packed, const at::Tensor* bias, int64_t n,
                            const at::Tensor& y) {
  TORCH_CHECK(packed.scalar_type() == at::kFloat || packed.scalar_type() == at::kBFloat16,
              "packed_linear_f32 takes a float32 or bfloat16 packed weight");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "packed_linear_f32 takes x of shape [rows, in_features]");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(n % kPanel == 0 && packed.numel() == n * k && packed.is_contiguous(),
              "the packed weight must hold out_features x in_features with out_features a multiple of 16; pack it "
              "with frame_platform_cpu.kernels.pack_weight_f32");
  TORCH_CHECK(y.dim() == 2 && y.size(0) == m && y.size(1) == n && y.is_contiguous() && y.scalar_type() == at::kFloat,
              "out must be a contiguous float32 [rows, out_features] tensor");
  return F32Product{x.data_ptr<float>(), packed.data_ptr(), bias_data(bias, n), y.data_ptr<float>(), m, k, n,
                    packed.scalar_type() == at::kBFloat16};
}
#endif

// float32 x and weight: y float32. bfloat16 weight (storage only: this CPU has no bfloat16 dot product): x
// float32 or bfloat16, widened once, products and sums in float32, y in x's dtype, rounded once at the end as
// torch's bfloat16 matmuls round.
// `into`: the tensor to write y into (a recorded step's planned buffer, of x's dtype), else a new one.
at::Tensor f32_product(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, int64_t n,
                       const at::Tensor* into) {
#if defined(__AVX2__) && defined(__FMA__)
  const bool bf16_weight = packed.scalar_type() == at::kBFloat16;
  TORCH_CHECK((packed.scalar_type() == at::kFloat && x.scalar_type() == at::kFloat) ||
                  (bf16_weight && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16)),
              "packed_linear_f32 takes a float32 packed weight with float32 x, or a bfloat16 one with float32 or "
              "bfloat16 x");
  TORCH_CHECK(x.dim() == 2, "packed_linear_f32 takes x of shape [rows, in_features]");
  const at::Tensor xc = x.scalar_type() == at::kFloat ? x.contiguous() : x.to(at::kFloat).contiguous();
  const int64_t m = xc.size(0), k = xc.size(1);
  TORCH_CHECK(n % kPanel == 0 && packed.numel() == n * k,
              "the packed weight must hold out_features x in_features with out_features a multiple of 16; pack it "
              "with frame_platform_cpu.kernels.pack_weight_f32");
  at::Tensor y = into != nullptr && x.scalar_type() == at::kFloat ? *into : at::empty({m, n}, xc.options());
  const at::Tensor pc = packed.contiguous();
  const F32Product product = make_f32_product(xc, pc, bias.has_value() ? &*bias : nullptr, n, y);
  if (m > 0) at::parallel_for(0, product.units(), 1, [&](int64_t begin, int64_t end) { product.run(begin, end); });
  if (x.scalar_type() == at::kFloat) return y;
  if (into == nullptr) return y.to(x.scalar_type());
  into->copy_(y);  // bfloat16 x: y rounded into the planned buffer
  return *into;
#else
  TORCH_CHECK(false, "packed_linear_f32 needs a CPU with AVX2 and FMA; this build has no such instructions");
#endif
}

at::Tensor packed_linear_f32(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                             int64_t n) {
  return f32_product(x, packed, bias, n, nullptr);
}

// The `_into` form writes into `out` (what the plain form would return): a replayed step's planned buffer.
void packed_linear_f32_into(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                            int64_t n, at::Tensor& out) {
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == n && out.scalar_type() == x.scalar_type(),
              "out must be a [rows, out_features] tensor of x's dtype");
  f32_product(x, packed, bias, n, &out);
}

const frame_cpu::RegisterDirect direct_f32("frame_cpu::packed_linear_f32_into", [](const c10::IValue* const* a) {
  packed_linear_f32_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toOptional<at::Tensor>(), a[3]->toInt(),
                         frame_cpu::written(a[4]));
});

#if defined(__AVX2__) && defined(__FMA__)
// Float32 x contiguous, the weight contiguous: a team's threads can share the product; otherwise (bfloat16 x,
// which is widened first) the plain form runs on the team's first thread.
bool shareable(const c10::IValue* const* a) {
  return a[0]->toTensor().scalar_type() == at::kFloat && a[0]->toTensor().is_contiguous() &&
         a[1]->toTensor().is_contiguous();
}

F32Product f32_product_of(const c10::IValue* const* a) {
  return make_f32_product(a[0]->toTensor(), a[1]->toTensor(), a[2]->isNone() ? nullptr : &a[2]->toTensor(),
                          a[3]->toInt(), a[4]->toTensor());
}

// The bound form (direct_ops.h): the checked F32Product, each thread running its share of the units from it.
const frame_cpu::RegisterBind bind_f32("frame_cpu::packed_linear_f32_into",
                                       [](const c10::IValue* const* a, frame_cpu::BoundCall& call) {
  if (!shareable(a)) return false;
  frame_cpu::bind_shares(call, f32_product_of(a));
  return true;
}, frame_cpu::Stretch::kAnchors);
#endif

// `weight` [n, k] (float32, or bfloat16 kept as it is) in the layout this build's `packed_linear_f32` reads,
// flattened: panels of 16 columns, [n / 16][k][16]; on AVX-512 a bfloat16 weight's pairs of panels two columns a
// lane, [n / 32][k][16][2], and a last, odd panel [k][16].
at::Tensor pack_weight_f32(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % kPanel == 0,
              "pack_weight_f32 takes a weight [out_features, in_features] with out_features a multiple of 16");
  const at::Tensor w = weight.scalar_type() == at::kBFloat16 ? weight : weight.to(at::kFloat);
  const int64_t n = w.size(0), k = w.size(1);
  const int64_t paired = w.scalar_type() == at::kBFloat16 && kBf16PairLanes ? n / (2 * kPanel) * 2 * kPanel : 0;
  at::Tensor panels = w.narrow(0, paired, n - paired).reshape({-1, kPanel, k}).permute({0, 2, 1}).reshape(-1);
  if (paired == 0) return panels.contiguous();
  // [pairs][2][16][k] -> [pairs][k][16][2]: column j of a pair's first panel, then column j of its second.
  const at::Tensor pairs = w.narrow(0, 0, paired).reshape({-1, 2, kPanel, k}).permute({0, 3, 2, 1}).reshape(-1);
  return at::cat({pairs, panels}).contiguous();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("packed_linear_f32(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("packed_linear_f32_into(Tensor x, Tensor packed, Tensor? bias, int out_features, Tensor(a!) out) -> ()");
  m.def("pack_weight_f32(Tensor weight) -> Tensor");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("packed_linear_f32", &packed_linear_f32);
  m.impl("packed_linear_f32_into", &packed_linear_f32_into);
  m.impl("pack_weight_f32", &pack_weight_f32);
}
