// y = (s_x q_x) (s_w q_w)^T (+ b): int8 weights with one scale per output channel (the `int8` quantization
// plugin's format) against x quantized per row (per token) at run time, W8A8 as SmoothQuant-style engines run it:
// x is first multiplied per input feature by the weight's smoothing factors where it has them (input_scale),
// each row of x gets s_x = max|x| / 127 and q_x = round(x / s_x), the products are summed exactly in int32, and
// the epilogue scales once by s_x s_w, adds the bias and rounds to x's dtype (SwiGLU's [gate | up] weight: to
// bfloat16, then silu(gate) * up).
//
// The weight is packed once as panels of 32 output columns holding, for each group of four inputs, the columns'
// four int8 side by side: [n / 32][k / 4][32][4] (a last panel of 16 when n is an odd multiple of 16). That is
// the layout of AMX's `tdpbssd` weight tile and of AVX-512 VNNI's `vpdpbusd` (16 columns x 4 inputs per zmm).
// - AMX (Sapphire Rapids and later; k a multiple of 64): amx_gemm.h's loop on tdpbssd, twice the tiles' bfloat16
//   rate and half the weight bytes of bfloat16.
// - AVX-512 VNNI (Ice Lake / Cascade Lake servers, Zen 4/5): a register tile of up to 12 rows x 32 columns over
//   vpdpbusd. It multiplies unsigned by signed bytes, so x goes in as q_x + 128 and the epilogue takes away 128
//   times each column's weight sum (computed once at packing).
// Both sum every row's products in the same order whatever the number of rows, so a row's result does not depend
// on its batch (within one path).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "amx_gemm.h"
#include "swiglu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <omp.h>

#if defined(__AVX512VNNI__) && FRAME_AVX512_BF16_BITS  // AVX-512 BF16 only speeds up the rounding
#include <immintrin.h>

#include "panel_prefetch.h"
#define FRAME_W8A8_VNNI 1
#endif

namespace {

constexpr int64_t kPanel = 32;
constexpr int kRowTile = 12;  // rows per VNNI register tile: 12 x 2 accumulators
constexpr int64_t kRowBlockBytes = 256 * 1024;  // quantized x rows per pass over the panels
constexpr int64_t kQuantizeGrain = 64 * 1024;   // elements of x per thread, at least, when quantizing

#if FRAME_W8A8_VNNI
// acc + (u8 a) . (s8 b) by 4-byte groups, written in assembly: GCC 12's _mm512_dpbusd_epi32 does not tie the
// accumulator to the instruction's output, so in a register tile it copied every accumulator (and spilled two)
// once per quad, which halved the tile's rate (505 against 936 GOP/s on one Zen 5 core).
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

inline __m512 load16(const float* x, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, x); }
inline __m512 load16(const c10::BFloat16* x, __mmask16 mask) {
  return frame_cpu::load16(reinterpret_cast<const uint16_t*>(x), mask);
}

// Rows [begin, end) of x as int8 with one scale each (zero rows get scale 0 and all-zero q), sixteen values at a
// time: the rounding is the CPU's default, to nearest even, as std::nearbyint. `smooth` (or nullptr) multiplies
// input feature j first (SmoothQuant's 1 / s_j). `offset` 128 stores q + 128 as unsigned bytes, for vpdpbusd. (A
// scalar loop here cost more than the int8 product saved over bfloat16's.)
template <typename T>
void quantize_rows(const T* x, int64_t begin, int64_t end, int64_t k, const float* smooth, uint8_t* q, float* scale,
                   int offset) {
  const __m512 sign_off = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t r = begin; r < end; ++r) {
    const T* row = x + r * k;
    __m512 top = _mm512_setzero_ps();
    auto value = [&](int64_t i, __mmask16 mask) {
      const __m512 v = load16(row + i, mask);
      return smooth != nullptr ? _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, smooth + i)) : v;
    };
    for (int64_t i = 0; i < k; i += 16) top = _mm512_max_ps(top, _mm512_and_ps(value(i, frame_cpu::tail_mask16(k - i)), sign_off));
    const float amax = _mm512_reduce_max_ps(top);
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    scale[r] = amax / 127.f;
    const __m128i shift = _mm_set1_epi8(static_cast<char>(offset));
    for (int64_t i = 0; i < k; i += 16) {
      const __mmask16 mask = frame_cpu::tail_mask16(k - i);
      const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(value(i, mask), inv));
      _mm_mask_storeu_epi8(q + r * k + i, mask, _mm_add_epi8(_mm512_cvtsepi32_epi8(v), shift));
    }
  }
}

struct Output {
  bool gated;
  bool as_float;
  const float* w_scale;  // [n], ordered as the packed columns
  const float* bias;     // [n] or nullptr
  const float* x_scale;  // [m]
  void* y;
  int64_t width;  // columns of y

  // 16 columns of row r from their int32 sums (already corrected for any offset): scaled, biased, stored. Inlined
  // into the tiles: called out of line once per row, it cost about a tenth of a 12-row tile's time.
  __attribute__((always_inline)) inline void finish(int64_t r, int64_t col, const __m512i* sums, int cols, int64_t out_col) const {
    __m512 v[2];
    const __m512 sx = _mm512_set1_ps(x_scale[r]);
    for (int j = 0; j < cols; ++j) {
      const __m512 scale = _mm512_mul_ps(sx, _mm512_loadu_ps(w_scale + col + 16 * j));
      v[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(sums[j]), scale);
      if (bias != nullptr) v[j] = _mm512_add_ps(v[j], _mm512_loadu_ps(bias + col + 16 * j));
    }
    if (gated) {
      auto* out = static_cast<uint16_t*>(y) + r * width + out_col;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                          frame_cpu::swiglu16(frame_cpu::round_to_bf16(v[0]), frame_cpu::round_to_bf16(v[1])));
      return;
    }
    for (int j = 0; j < cols; ++j) {
      if (as_float) {
        _mm512_storeu_ps(static_cast<float*>(y) + r * width + out_col + 16 * j, v[j]);
      } else {
        auto* out = static_cast<uint16_t*>(y) + r * width + out_col + 16 * j;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), frame_cpu::narrow16(v[j]));
      }
    }
  }
};

// R rows x 16 * C columns: acc += (q_x + 128) . w over k / 4 quads, then minus 128 * column sums. `ahead_lines`
// lines from `ahead` (part of the next panel) are asked into L1 along the way (panel_prefetch.h).
template <int R, int C>
void vnni_tile(const uint8_t* x, int64_t k, const int8_t* panel, const int32_t* col_sums, const Output& out,
               int64_t r0, int64_t col, int64_t out_col, const char* ahead, int64_t ahead_lines) {
  // Every loop over rows and columns is unrolled, and the epilogue gets a copy of each row's sums, so that the
  // accumulators stay in registers from the first quad to the store.
  __m512i acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
  frame_cpu::steps_with_prefetch(k / 4, ahead, ahead_lines, [&](int64_t q) __attribute__((always_inline)) {
    __m512i w[C];
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) w[c] = _mm512_loadu_si512(panel + (q * C + c) * 64);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      int32_t bytes;
      std::memcpy(&bytes, x + r * k + 4 * q, sizeof bytes);
      const __m512i a = _mm512_set1_epi32(bytes);
#pragma GCC unroll 2
      for (int c = 0; c < C; ++c) acc[r][c] = dpbusd(acc[r][c], a, w[c]);
    }
  });
  __m512i correction[C];
#pragma GCC unroll 2
  for (int c = 0; c < C; ++c)
    correction[c] = _mm512_slli_epi32(_mm512_loadu_si512(col_sums + col + 16 * c), 7);  // 128 * sum(w)
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    __m512i sums[C];
#pragma GCC unroll 2
    for (int c = 0; c < C; ++c) sums[c] = _mm512_sub_epi32(acc[r][c], correction[c]);
    out.finish(r0 + r, col, sums, C, out_col);
  }
}

template <int C>
void vnni_rows(int rows, const uint8_t* x, int64_t k, const int8_t* panel, const int32_t* col_sums,
               const Output& out, int64_t r0, int64_t col, int64_t out_col, const char* ahead, int64_t ahead_lines) {
  switch (rows) {
#define FRAME_W8A8_CASE(R) \
  case R: vnni_tile<R, C>(x, k, panel, col_sums, out, r0, col, out_col, ahead, ahead_lines); break;
    FRAME_W8A8_CASE(1) FRAME_W8A8_CASE(2) FRAME_W8A8_CASE(3) FRAME_W8A8_CASE(4)
    FRAME_W8A8_CASE(5) FRAME_W8A8_CASE(6) FRAME_W8A8_CASE(7) FRAME_W8A8_CASE(8)
    FRAME_W8A8_CASE(9) FRAME_W8A8_CASE(10) FRAME_W8A8_CASE(11) FRAME_W8A8_CASE(12)
#undef FRAME_W8A8_CASE
    default: TORCH_CHECK(false, "row tile of ", rows);
  }
}
#endif

// path: 0 the best this CPU has (AMX where k allows, else VNNI), 1 AMX, 2 VNNI.
at::Tensor w8a8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& w_scale, const at::Tensor& col_sums,
                const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& input_scale, int64_t n,
                bool gated, int64_t path) {
#if FRAME_W8A8_VNNI
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "w8a8_linear takes float32 or bfloat16 x of shape [rows, in_features]");
  TORCH_CHECK(!gated || x.scalar_type() == at::kBFloat16, "the gated W8A8 product takes bfloat16 x");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1);
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous() && packed.numel() == n * k && k % 4 == 0 &&
                  n % (gated ? 32 : 16) == 0,
              "the packed weight must be int8 [out_features x in_features], in_features a multiple of 4 and "
              "out_features of 16 (32 gated); pack it with frame_platform_cpu.w8a8");
  TORCH_CHECK(w_scale.scalar_type() == at::kFloat && w_scale.is_contiguous() && w_scale.numel() == n &&
                  col_sums.scalar_type() == at::kInt && col_sums.is_contiguous() && col_sums.numel() == n,
              "scales must be float32 and column sums int32, one per output feature");
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "bias must be float32 with out_features elements, ordered as the packed columns");
    bias_ptr = bias->data_ptr<float>();
  }
  const float* smooth = nullptr;
  if (input_scale.has_value() && input_scale->defined()) {
    TORCH_CHECK(input_scale->scalar_type() == at::kFloat && input_scale->is_contiguous() && input_scale->numel() == k,
                "input_scale must be float32 with in_features elements");
    smooth = input_scale->data_ptr<float>();
  }
  const bool amx_fits = k % 64 == 0 && frame_cpu::amx_permitted();
  TORCH_CHECK(path != 1 || amx_fits, "the AMX W8A8 path needs AMX tiles and in_features a multiple of 64");
  const bool amx = path == 1 || (path == 0 && amx_fits);
  const int64_t width = gated ? n / 2 : n;
  at::Tensor y = at::empty({m, width}, xc.options());
  if (m == 0) return y;
  const std::unique_ptr<uint8_t[]> q_rows(new uint8_t[m * k]);  // every byte written below: no zero fill
  uint8_t* const q = q_rows.get();
  std::vector<float> x_scale(m);
  const int offset = amx ? 0 : 128;
  auto quantize = [&](int64_t begin, int64_t end) {
    if (xc.scalar_type() == at::kFloat) {
      quantize_rows(xc.data_ptr<float>(), begin, end, k, smooth, q, x_scale.data(), offset);
    } else {
      quantize_rows(xc.data_ptr<c10::BFloat16>(), begin, end, k, smooth, q, x_scale.data(), offset);
    }
  };
  const Output out{gated, xc.scalar_type() == at::kFloat, w_scale.data_ptr<float>(), bias_ptr, x_scale.data(),
                   y.data_ptr(), width};
  const auto* wp = reinterpret_cast<const int8_t*>(packed.data_ptr());
  const int32_t* sums = col_sums.data_ptr<int32_t>();
  if (amx) {
#if FRAME_AMX
    // Split over threads only when there is enough of x: a decode step's few rows quantize in a couple of
    // microseconds, less than waking the pool.
    at::parallel_for(0, m, std::max<int64_t>(8, kQuantizeGrain / k), quantize);
    frame_cpu::amx::product<frame_cpu::amx::Dot::kInt8>(
        q, m, k, reinterpret_cast<const uint8_t*>(wp), n,
        [&](const int32_t* c, int64_t rows, int cols, int64_t row, int64_t panel) {
          const int64_t col = panel * kPanel;
          for (int64_t r = 0; r < rows; ++r) {
            const __m512i acc[2] = {_mm512_load_si512(c + r * kPanel), _mm512_load_si512(c + r * kPanel + 16)};
            out.finish(row + r, col, acc, cols, gated ? panel * 16 : col);
          }
        });
    return y;
#endif
  }
  // As packed_linear.cpp: rows a block at a time (their q in L2) across the thread's panels, and each panel's later
  // row tiles asking for the next panel (panel_prefetch.h). One parallel region quantizes a share of x's rows per
  // thread, waits for the others', then multiplies the thread's panels: a decode step's x was quantized on the
  // calling thread while the other waited, and a prefill's took a second fork and join.
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t block_rows = std::max<int64_t>(kRowTile, kRowBlockBytes / k / kRowTile * kRowTile);
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), panels));
#pragma omp parallel num_threads(threads)
  {
    const int64_t thread = omp_get_thread_num(), count = omp_get_num_threads();
    quantize(m * thread / count, m * (thread + 1) / count);
#pragma omp barrier
    const int64_t begin = panels * thread / count, end = panels * (thread + 1) / count;
    for (int64_t b0 = 0; b0 < m; b0 += block_rows) {
      const int64_t b1 = std::min<int64_t>(m, b0 + block_rows);
      const int64_t tiles = (b1 - b0 + kRowTile - 1) / kRowTile;
      for (int64_t p = begin; p < end; ++p) {
        const int64_t col = p * kPanel;
        const int8_t* panel = wp + col * k;
        const int64_t out_col = gated ? p * 16 : col;
        // Lines of this thread's next panel, when it has one.
        const int64_t lines = p + 1 < end ? std::min<int64_t>(kPanel, n - col - kPanel) * k / 64 : 0;
        const char* next = lines > 0 ? reinterpret_cast<const char*>(panel + kPanel * k) : nullptr;
        for (int64_t t = 0, r = b0; r < b1; ++t, r += kRowTile) {
          const int rows = static_cast<int>(std::min<int64_t>(kRowTile, b1 - r));
          const frame_cpu::PrefetchShare share = frame_cpu::prefetch_share(lines, b1 - b0, tiles, t);
          const char* ahead = next + 64 * share.first;
          const uint8_t* xq = q + r * k;
          if (n - col >= kPanel) vnni_rows<2>(rows, xq, k, panel, sums, out, r, col, out_col, ahead, share.count);
          else vnni_rows<1>(rows, xq, k, panel, sums, out, r, col, out_col, ahead, share.count);
        }
      }
    }
  }
  return y;
#else
  TORCH_CHECK(false, "w8a8_linear needs AVX-512 VNNI, BW and VL; this build has no such instructions");
#endif
}

at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& w_scale,
                       const at::Tensor& col_sums, const c10::optional<at::Tensor>& bias,
                       const c10::optional<at::Tensor>& input_scale, int64_t out_features, int64_t path) {
  return w8a8(x, packed, w_scale, col_sums, bias, input_scale, out_features, false, path);
}

at::Tensor w8a8_swiglu(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& w_scale,
                       const at::Tensor& col_sums, const c10::optional<at::Tensor>& bias,
                       const c10::optional<at::Tensor>& input_scale, int64_t intermediate, int64_t path) {
  return w8a8(x, packed, w_scale, col_sums, bias, input_scale, 2 * intermediate, true, path);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("w8a8_linear(Tensor x, Tensor packed, Tensor w_scale, Tensor col_sums, Tensor? bias, Tensor? input_scale, "
        "int out_features, int path=0) -> Tensor");
  m.def("w8a8_swiglu(Tensor x, Tensor packed, Tensor w_scale, Tensor col_sums, Tensor? bias, Tensor? input_scale, "
        "int intermediate, int path=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("w8a8_linear", &w8a8_linear);
  m.impl("w8a8_swiglu", &w8a8_swiglu);
}
