// y = x W^T (+ b) for a weight in ggml's super-blocks of 256 (q4_K, q6_K, q3_K, q2_K, q5_K, iq4_xs), read as the
// GGUF file stores them (memory-mapped: nothing is copied or repacked at load), float32 or bfloat16 x: the linears
// of a K-quant GGUF (Q4_K_M, Q3_K_M, Q2_K, ... presets) served packed.
//
// x is quantized per row and super-block of 256 inputs to int8 with one float32 scale d_x = max|x| / 127 and the
// sums of q_x per 16 (llama.cpp's q8_K, which its own K-quant dot products take). A weight super-block is unpacked
// in registers (kquant_blocks.h: u, sc, mn, d, md) and, for up to four rows of x at once,
//   dot = d_x (d sum_c sc[c] sum_{i in c} u_i q_x,i - md sum_c mn[c] sum_{i in c} q_x,i)
// whose inner sums are exact integers: u q_x with vpmaddubsw (u unsigned and at most 63: no saturation; iq4_xs's
// signed levels through their absolute value and x's sign), times sc with vpmaddwd (AVX2) or vpdpwssd (AVX-512
// VNNI), the mins against x's sums per 16 with vpmaddwd. `path` picks the code: 0 plain C++ (CPUs without AVX2),
// 1 AVX2, 2 AVX-512 BW + VNNI (512-bit vectors); all sum the same integers, so they differ only in the order of
// the float32 sums (q6_K and q3_K, whose offsets stay in the one integer per super-block: not at all).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "direct_ops.h"
#include "kquant_blocks.h"
#include "linear_bias.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__) && FRAME_KQUANT_AVX2
#define FRAME_KQUANT_VNNI 1
#endif

namespace {

using namespace kquant_blocks;
constexpr int kRowTile = 4;   // rows of x per pass over a weight row (AVX2, portable: 16 vector registers)
constexpr int kVnniTile = 8;  // the same with 32 (a super-block's unpacked u and scales stay in registers)

// x's rows quantized per super-block: q [m][k] int8, d [m][k / 256] float32, sums [m][k / 16] int16.
struct SuperView {
  const int8_t* q;
  const float* d;
  const int16_t* sums;
};

struct SuperRows {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> sums;

  operator SuperView() const { return {q.data(), d.data(), sums.data()}; }
};

template <typename T>
void quantize_row(const T* x, int64_t k, int8_t* q, float* d, int16_t* sums) {
  for (int64_t b = 0; b < k / kSuper; ++b) {
    float xs[kSuper];
    float amax = 0.f;
    for (int i = 0; i < kSuper; ++i) {
      xs[i] = static_cast<float>(x[b * kSuper + i]);
      amax = std::max(amax, std::fabs(xs[i]));
    }
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int c = 0; c < kSuper / 16; ++c) {
      int sum = 0;
      for (int i = 16 * c; i < 16 * c + 16; ++i) {
        const int v = static_cast<int>(std::nearbyint(xs[i] * inv));
        q[b * kSuper + i] = static_cast<int8_t>(v);
        sum += v;
      }
      sums[b * 16 + c] = static_cast<int16_t>(sum);
    }
    d[b] = amax / 127.f;
  }
}

// Row `r` of x ([rows, k], float32 where `is_float`, else bfloat16) quantized into q [k], d [k / 256], sums [k / 16].
void quantize_x_row(const void* x, bool is_float, int64_t r, int64_t k, int8_t* q, float* d, int16_t* sums) {
  if (is_float) quantize_row(static_cast<const float*>(x) + r * k, k, q, d, sums);
  else quantize_row(static_cast<const c10::BFloat16*>(x) + r * k, k, q, d, sums);
}

SuperRows quantize_rows(const at::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1), nb = k / kSuper;
  SuperRows out{std::vector<int8_t>(m * k), std::vector<float>(m * nb), std::vector<int16_t>(m * k / 16)};
  const bool is_float = x.scalar_type() == at::kFloat;
  const void* data = x.data_ptr();
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      quantize_x_row(data, is_float, r, k, out.q.data() + r * k, out.d.data() + r * nb, out.sums.data() + r * k / 16);
  });
  return out;
}

// q6_K's and q3_K's offsets (w = d sc (u - 32), d sc (u - 4)) share the scale d, so their mins term leaves the
// integer sum before it meets a float, as llama.cpp's dot products do: two float32 terms far larger than their
// difference, cancelling, lost up to 8e-6 of sum(|w| |x|) on SmolLM2's down projections (inputs up to 2,615).
// The vector paths reduce the super-block's lanes to that one integer before converting it: a lane holds u q_x
// of some chunks and the mins of others, so lanes converted and scaled one by one still cancel as floats (that was
// the AVX2 and VNNI kernels' 4e-6 of sum(|w| |x|) where the portable one, and llama.cpp, stay at 1e-7).
constexpr bool exact_offset(int64_t format) { return mn_shift(format) > 0; }

// One weight row against `rows` rows of x (from r0), plain C++.
template <int64_t Format>
void row_portable(const uint8_t* w, int64_t nb, const SuperView& xq, int64_t r0, int rows, int64_t k, float* dots) {
  for (int r = 0; r < rows; ++r) dots[r] = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * block_bytes(Format);
    const Header h = header<Format>(blk);
    int8_t u[kSuper];
    values_portable<Format>(blk, u);
    for (int r = 0; r < rows; ++r) {
      const int64_t row = r0 + r;
      const int8_t* qx = xq.q + row * k + b * kSuper;
      const int16_t* sums = xq.sums + row * k / 16 + b * 16;
      int32_t dot = 0, mins = 0;
      for (int c = 0; c < 16; ++c) {
        int32_t chunk = 0;
        for (int i = 16 * c; i < 16 * c + 16; ++i) chunk += u[i] * qx[i];
        dot += sc_of<Format>(h, c) * chunk;
        mins += mn_of<Format>(h, c) * sums[c];
      }
      const float dx = xq.d[row * nb + b];
      if constexpr (exact_offset(Format))
        dots[r] += dx * (h.d * static_cast<float>(dot - mins));
      else if constexpr (mn_shift(Format) == 0)  // iq4_xs, no mins: d_x d first, as llama.cpp's dot scales it
        dots[r] += (dx * h.d) * static_cast<float>(dot);
      else
        dots[r] += dx * (h.d * static_cast<float>(dot) - h.md * static_cast<float>(mins));
    }
  }
}

#if FRAME_KQUANT_AVX2
inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Vector g's scales (values 32g..32g+31: chunks 2g, 2g+1) as 16 int16 lanes, 8 a chunk: each vpmaddubsw lane pair
// (2 values) meets its chunk's scale in vpmaddwd.
inline __m256i pair_scales(__m128i sc, int g) {
  const __m128i pick = _mm_set_epi64x(0x0101010101010101LL * (2 * g + 1), 0x0101010101010101LL * (2 * g));
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick));
}

// u q_x a pair of lanes as int16; iq4_xs's signed u through |u| and q_x with u's sign.
template <int64_t Format>
inline __m256i products(__m256i u, __m256i qx) {
  if constexpr (signed_values(Format)) return _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(qx, u));
  return _mm256_maddubs_epi16(u, qx);
}

template <int64_t Format, int R>
void rows_avx2(const uint8_t* w, int64_t nb, const SuperView& xq, int64_t r0, int64_t k, float* dots) {
  __m256 acc[R];
  float exact[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    exact[r] = 0.f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * block_bytes(Format);
    _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * block_bytes(Format)), _MM_HINT_T0);
    const Header h = header<Format>(blk);
    __m256i u[8];
    values_avx2<Format>(blk, u);
    const __m128i sc = chunk_bytes<Format>(h.sc);
    const __m256i mn = mins16<Format>(h);
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* qx = xq.q + row * k + b * kSuper;
      __m256i dot = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + 32 * g));
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(products<Format>(u[g], x), pair_scales(sc, g)));
      }
      const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.sums + row * k / 16 + b * 16));
      const float dx = xq.d[row * nb + b];
      if constexpr (exact_offset(Format)) {  // as row_portable: one integer, then the floats
        exact[r] += dx * (h.d * static_cast<float>(hsum_epi32(_mm256_sub_epi32(dot, _mm256_madd_epi16(mn, sums)))));
        continue;
      }
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dx * h.d), acc[r]);
      if constexpr (mn_shift(Format) < 0)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mn, sums)), _mm256_set1_ps(-dx * h.md), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) dots[r] = exact_offset(Format) ? exact[r] : hsum(acc[r]);
}
#endif

#if FRAME_KQUANT_VNNI
// vpermw's picks for vector v (values 64v..64v+63): int16 lane l takes chunk 4v + l / 8's scale, so each vpmaddubsw
// lane pair (2 values) meets its chunk's scale in vpdpwssd.
alignas(64) constexpr int16_t kScalePicks[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
     14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};

// As pair_scales for 64 values (vector v: chunks 4v..4v+3), 32 int16 lanes, from the 16 scales widened once.
inline __m512i pair_scales512(__m512i scales16, int v) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(kScalePicks[v]), scales16);
}

// A super-block's 256 u as 4 vectors of 64 bytes (vector v: values 64v..64v+63). q4_K's byte l of its 32-byte
// group v holds value 64v + l in its low nibble and 64v + 32 + l in its high: one load to both halves, the upper
// shifted by 4. Other formats through values_avx2.
template <int64_t Format>
inline void values512(const uint8_t* blk, __m512i* u) {
  if constexpr (Format == kQ4_K) {
    const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int v = 0; v < 4; ++v) {
      const __m512i q = _mm512_broadcast_i64x4(load32(blk + 16 + 32 * v));
      u[v] = _mm512_and_si512(_mm512_srlv_epi16(q, shifts), low4);
    }
  } else {
    __m256i u8[8];
    values_avx2<Format>(blk, u8);
    for (int v = 0; v < 4; ++v) u[v] = _mm512_inserti64x4(_mm512_castsi256_si512(u8[2 * v]), u8[2 * v + 1], 1);
  }
}

template <int64_t Format>
inline __m512i products512(__m512i u, __m512i qx) {
  if constexpr (signed_values(Format)) {
    const __mmask64 negative = _mm512_movepi8_mask(u);
    return _mm512_maddubs_epi16(_mm512_abs_epi8(u), _mm512_mask_sub_epi8(qx, negative, _mm512_setzero_si512(), qx));
  }
  return _mm512_maddubs_epi16(u, qx);
}

template <int64_t Format, int R>
void rows_vnni(const uint8_t* w, int64_t nb, const SuperView& xq, int64_t r0, int64_t k, float* dots) {
  __m512 acc[R];
  __m256 mins_acc[R];
  float exact[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    mins_acc[r] = _mm256_setzero_ps();
    exact[r] = 0.f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * block_bytes(Format);
    _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * block_bytes(Format)), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * block_bytes(Format) + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * block_bytes(Format) + 128), _MM_HINT_T0);
    const Header h = header<Format>(blk);
    __m512i u[4], s[4];
    values512<Format>(blk, u);
    const __m512i scales16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(chunk_bytes<Format>(h.sc)));
    for (int v = 0; v < 4; ++v) s[v] = pair_scales512(scales16, v);
    const __m256i mn = mins16<Format>(h);
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* qx = xq.q + row * k + b * kSuper;
      __m512i dot = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v)
        dot = _mm512_dpwssd_epi32(dot, products512<Format>(u[v], _mm512_loadu_si512(qx + 64 * v)), s[v]);
      const float dx = xq.d[row * nb + b];
      if constexpr (exact_offset(Format)) {  // as row_portable: one integer, then the floats
        const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.sums + row * k / 16 + b * 16));
        const __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(dot), _mm512_extracti64x4_epi64(dot, 1));
        exact[r] += dx * (h.d * static_cast<float>(hsum_epi32(_mm256_sub_epi32(half, _mm256_madd_epi16(mn, sums)))));
        continue;
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(dx * h.d), acc[r]);
      if constexpr (mn_shift(Format) < 0) {
        const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.sums + row * k / 16 + b * 16));
        mins_acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mn, sums)), _mm256_set1_ps(-dx * h.md),
                                      mins_acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    dots[r] = exact_offset(Format) ? exact[r] : _mm512_reduce_add_ps(acc[r]) + hsum(mins_acc[r]);
}
#endif

// The highest `path` this build runs: 2 with AVX-512 BW and VNNI, 1 with AVX2, FMA and F16C, else 0.
int64_t kquant_best_path() {
#if FRAME_KQUANT_VNNI
  return 2;
#elif FRAME_KQUANT_AVX2
  return 1;
#else
  return 0;
#endif
}

template <int64_t Format>
void tile(int64_t path, const uint8_t* w, int64_t nb, const SuperView& xq, int64_t r0, int rows, int64_t k,
          float* dots) {
#if FRAME_KQUANT_VNNI
  if (path == 2) {
    switch (rows) {
      case 1: return rows_vnni<Format, 1>(w, nb, xq, r0, k, dots);
      case 2: return rows_vnni<Format, 2>(w, nb, xq, r0, k, dots);
      case 3: return rows_vnni<Format, 3>(w, nb, xq, r0, k, dots);
      case 4: return rows_vnni<Format, 4>(w, nb, xq, r0, k, dots);
      case 5: return rows_vnni<Format, 5>(w, nb, xq, r0, k, dots);
      case 6: return rows_vnni<Format, 6>(w, nb, xq, r0, k, dots);
      case 7: return rows_vnni<Format, 7>(w, nb, xq, r0, k, dots);
      default: return rows_vnni<Format, 8>(w, nb, xq, r0, k, dots);
    }
  }
#endif
#if FRAME_KQUANT_AVX2
  if (path == 1) {
    switch (rows) {
      case 1: return rows_avx2<Format, 1>(w, nb, xq, r0, k, dots);
      case 2: return rows_avx2<Format, 2>(w, nb, xq, r0, k, dots);
      case 3: return rows_avx2<Format, 3>(w, nb, xq, r0, k, dots);
      default: return rows_avx2<Format, 4>(w, nb, xq, r0, k, dots);
    }
  }
#endif
  row_portable<Format>(w, nb, xq, r0, rows, k, dots);
}

// One product over a weight's super-blocks, its operands checked and resolved to pointers (make_kquant): what a
// plain call's parallel_for, a team's thread and a step program's bound record (direct_ops.h) all run, split by
// output column.
struct Kquant {
  const void* x;
  const uint8_t* weight;
  const float* bias;
  float* yf;             // float32 out (x float32)
  c10::BFloat16* yb;     // bfloat16 out
  int64_t m, k, n, nb, row_stride, format, path;
  bool as_float;

  // Bytes of quantized x rows a pass over the columns keeps in a core's L2.
  static constexpr int64_t kRowBlockBytes = 256 << 10;

  // Output columns [begin, end) from x quantized as `xq`. A prefill's x is taken in blocks of rows that stay in
  // L2 while every column passes over them: walking all rows for each column streamed the whole quantized x
  // (28 MB for 4,096 rows of 6,912) from memory once per column, and 4,096 rows ran at a third of 512's rate. The
  // tiles start where they did (multiples of the row tile), so each output is the same sum.
  void run(int64_t begin, int64_t end, const SuperView& xq) const {
    float dots[kVnniTile];
    const int64_t row_tile = path == 2 ? kVnniTile : kRowTile;
    const int64_t block_rows = std::max<int64_t>(1, kRowBlockBytes / k / row_tile) * row_tile;
    for (int64_t first = 0; first < m; first += block_rows) {
      const int64_t last = std::min(m, first + block_rows);
      for (int64_t col = begin; col < end; ++col) {
        const uint8_t* w = weight + col * row_stride;
        for (int64_t r0 = first; r0 < last; r0 += row_tile) {
          const int rows = static_cast<int>(std::min<int64_t>(row_tile, last - r0));
          with_format(format, [&](auto f) { tile<decltype(f)::value>(path, w, nb, xq, r0, rows, k, dots); });
          for (int r = 0; r < rows; ++r) {
            const float v = dots[r] + (bias ? bias[col] : 0.f);
            if (as_float) yf[(r0 + r) * n + col] = v;
            else yb[(r0 + r) * n + col] = c10::BFloat16(v);
          }
        }
      }
    }
  }
};

// Checks the operands (x contiguous, `y` [rows, out_features] of x's dtype) and points a Kquant at them. Only
// references are taken, no tensor handle.
Kquant make_kquant(const at::Tensor& x, const at::Tensor& blocks, int64_t format, const at::Tensor* bias,
                   int64_t path, const at::Tensor& y) {
  TORCH_CHECK(format >= 0 && format < kFormats, "kquant_linear takes q4_K, q6_K, q3_K, q2_K, q5_K or iq4_xs blocks");
  TORCH_CHECK(path >= 0 && path <= kquant_best_path(), "kquant_linear path ", path, " is not built here (best: ",
              kquant_best_path(), ")");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "kquant_linear takes float32 or bfloat16 x of shape [rows, in_features]");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.stride(1) == 1,
              "kquant_linear takes the weight's blocks as uint8 [out_features, row bytes], rows contiguous");
  const int64_t m = x.size(0), k = x.size(1), n = blocks.size(0), nb = k / kSuper;
  TORCH_CHECK(k % kSuper == 0 && blocks.size(1) == nb * block_bytes(format),
              "the blocks do not hold in_features = ", k, " inputs per row in this format");
  TORCH_CHECK(y.dim() == 2 && y.size(0) == m && y.size(1) == n && y.is_contiguous() && y.scalar_type() == x.scalar_type(),
              "out must be a contiguous [rows, out_features] tensor of x's dtype");
  const bool as_float = x.scalar_type() == at::kFloat;
  return Kquant{x.data_ptr(), blocks.data_ptr<uint8_t>(), bias_data(bias, n),
                as_float ? y.data_ptr<float>() : nullptr, as_float ? nullptr : y.data_ptr<c10::BFloat16>(),
                m, k, n, nb, blocks.stride(0), format, path, as_float};
}

// A team's share of `product`: x quantized (a lone row by every thread for itself, more rows a share each into
// the team's scratch), then its output columns.
void team_kquant(const Kquant& product, const frame_cpu::Team& team) {
  if (product.m == 0 || product.n == 0) return;
  const int64_t m = product.m, k = product.k, nb = product.nb;
  const frame_cpu::Team quantizer = m == 1 ? frame_cpu::Team{0, 1} : team;
  auto* scratch = static_cast<uint8_t*>(frame_cpu::team_scratch(quantizer, m * k + m * nb * 4 + m * k / 16 * 2 + 128));
  int8_t* q = reinterpret_cast<int8_t*>(scratch);
  float* d = reinterpret_cast<float*>(scratch + (m * k + 63) / 64 * 64);
  int16_t* sums = reinterpret_cast<int16_t*>(reinterpret_cast<uint8_t*>(d) + (m * nb * 4 + 63) / 64 * 64);
  const auto [first, last] = frame_cpu::share(m, quantizer);
  for (int64_t r = first; r < last; ++r)
    quantize_x_row(product.x, product.as_float, r, k, q + r * k, d + r * nb, sums + r * k / 16);
  frame_cpu::team_sync(quantizer);
  const auto [begin, end] = frame_cpu::share(product.n, team);
  if (begin < end) product.run(begin, end, SuperView{q, d, sums});
}

// `into`: the tensor to write y into (a recorded step's planned buffer), else a new one.
at::Tensor kquant_product(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                          const c10::optional<at::Tensor>& bias, int64_t path, const at::Tensor* into = nullptr) {
  TORCH_CHECK(x.dim() == 2, "kquant_linear takes float32 or bfloat16 x of shape [rows, in_features]");
  const at::Tensor xc = x.contiguous();
  const at::Tensor y = into != nullptr ? *into : at::empty({xc.size(0), blocks.size(0)}, xc.options());
  const Kquant product = make_kquant(xc, blocks, format, bias.has_value() ? &*bias : nullptr, path, y);
  if (product.m == 0 || product.n == 0) return y;
  const SuperRows xq = quantize_rows(xc);
  const SuperView view = xq;
  at::parallel_for(0, product.n, 8, [&](int64_t begin, int64_t end) { product.run(begin, end, view); });
  return y;
}

at::Tensor kquant_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                         const c10::optional<at::Tensor>& bias, int64_t path) {
  return kquant_product(x, blocks, format, bias, path);
}

// The `_into` form writes into `out` (what the plain form would return): a replayed step's planned buffer.
void kquant_linear_into(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                        const c10::optional<at::Tensor>& bias, int64_t path, at::Tensor& out) {
  kquant_product(x, blocks, format, bias, path, &out);
}

// Direct and bound forms (direct_ops.h) of kquant_linear_into: arguments x, blocks, format, bias, path, out.
Kquant kquant_of(const c10::IValue* const* a) {
  return make_kquant(a[0]->toTensor(), a[1]->toTensor(), a[2]->toInt(), a[3]->isNone() ? nullptr : &a[3]->toTensor(),
                     a[4]->toInt(), a[5]->toTensor());
}

const frame_cpu::RegisterDirect direct_kquant("frame_cpu::kquant_linear_into", [](const c10::IValue* const* a) {
  kquant_linear_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toInt(), a[3]->toOptional<at::Tensor>(), a[4]->toInt(),
                     frame_cpu::written(a[5]));
});

const frame_cpu::RegisterBind bind_kquant("frame_cpu::kquant_linear_into",
                                          [](const c10::IValue* const* a, frame_cpu::BoundCall& call) {
  if (!a[0]->toTensor().is_contiguous()) return false;
  call.as<Kquant>() = kquant_of(a);
  call.shared = true;
  call.run = [](const frame_cpu::BoundCall& bound, const frame_cpu::Team& team) { team_kquant(bound.as<Kquant>(), team); };
  return true;
}, frame_cpu::Stretch::kAnchors);

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("kquant_linear(Tensor x, Tensor blocks, int format, Tensor? bias, int path) -> Tensor");
  m.def("kquant_linear_into(Tensor x, Tensor blocks, int format, Tensor? bias, int path, Tensor(a!) out) -> ()");
  m.def("kquant_best_path() -> int", &kquant_best_path);
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("kquant_linear", &kquant_linear);
  m.impl("kquant_linear_into", &kquant_linear_into);
}
