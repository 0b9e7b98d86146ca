// The bfloat16 path's vector pieces: the sixteen-to-one score reduction, the online-softmax step over 32 keys
// (float32, probabilities optionally rounded to bfloat16 pairs), and the permuted head_dim order the interleaved V
// pairs leave the accumulators in. Used by the row kernels (bf16_rows.h) and the cascade's step size (cascade.h).
#pragma once

#include "common.h"

#include <algorithm>
#include <cmath>

#if defined(__AVX512BF16__)
namespace frame_cpu_paged {

// Sixteen vectors to one: lane j holds the sum of a[j]'s lanes (about 3 instructions per vector, against 8 for
// one _mm512_reduce_add_ps each).
inline __m512 reduce16(const __m512* a) {
  __m512 z[4];
  for (int g = 0; g < 4; ++g) {
    const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a[4 * g], a[4 * g + 1]),
                                   _mm512_unpackhi_ps(a[4 * g], a[4 * g + 1]));
    const __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(a[4 * g + 2], a[4 * g + 3]),
                                   _mm512_unpackhi_ps(a[4 * g + 2], a[4 * g + 3]));
    // Each 128-bit lane l now holds the partial sums over its 4 elements of keys 4g..4g+3.
    z[g] = _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(v01, v23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Eight vectors to eight values: lane b of the result is `op` (an add, a max) over a[b]'s sixteen lanes. Every
// vector's lanes meet in the same tree, so a row's sum has the same bits whichever of the eight it is.
template <class Op>
inline __m256 reduce8(const __m512* a, Op op) {
  __m512 z[2];
  for (int g = 0; g < 2; ++g) {
    const __m512 x = op(_mm512_unpacklo_ps(a[4 * g], a[4 * g + 1]), _mm512_unpackhi_ps(a[4 * g], a[4 * g + 1]));
    const __m512 y = op(_mm512_unpacklo_ps(a[4 * g + 2], a[4 * g + 3]), _mm512_unpackhi_ps(a[4 * g + 2], a[4 * g + 3]));
    // Each 128-bit lane l now holds vectors 4g..4g+3's partials over their elements of that lane.
    z[g] = op(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 v = op(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_castps512_ps256(
      op(_mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(3, 1, 3, 1))));
}

// Where accumulator float f sits in head_dim. Vector 2c holds the low halves of the 128-bit lanes of
// head_dim [32c, 32c + 32), vector 2c + 1 the high halves: lane 4L + i is element 8L + i, or 8L + 4 + i.
constexpr int permuted_dim(int f) {
  return 32 * (f / 32) + 8 * ((f % 16) / 4) + 4 * ((f / 16) % 2) + f % 4;
}
// write_row's permutes rely on it: head_dim 4-7 come from the high vector's lanes 0-3, 8-11 from the low's 4-7.
static_assert(permuted_dim(16) == 4 && permuted_dim(4) == 8 && permuted_dim(20) == 12 && permuted_dim(8) == 16);

constexpr int kKeys = 32;  // keys per online-softmax step: two vectors of scores

// The first key a sweep of rows from position `first_pos` on reads under a sliding window: the start of the step
// holding the first row's first key (steps stay where a sweep from key 0 puts them, so a row's sums do not depend on
// where its sweep began). The bfloat16 path's items start there, and a quantized pool's prefill widens from there.
inline int64_t window_sweep_start(int64_t first_pos, int64_t window) {
  return std::max<int64_t>(0, first_pos - window + 1) / kKeys * kKeys;
}

// tanh in sixteen lanes: (1 - e) / (1 + e) with e = exp(-2|x|), the sign put back. Near zero 1 - e cancels to an
// absolute error of a few 1e-8, below what a soft-capped score (cap * tanh(s / cap)) can notice.
inline __m512 tanh16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp_nonpositive(_mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(-2.0f)));
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
}

// Online-softmax update of one row with a step's scores (lo: keys 0-15, hi: 16-31; the keys it sees are
// [first, valid): below `first` they lie before its sliding window): turns lo and hi into the step's probabilities,
// zero outside those keys, and rescales acc. The row must see at least one.
template <int D>
inline void fold32_float(__m512& lo, __m512& hi, int valid, float& row_max, float& row_sum, float* acc, int first = 0) {
  const uint32_t bits = (valid >= 32 ? 0xffffffffu : (1u << valid) - 1u) & ~((1u << first) - 1u);
  const __mmask16 mask_lo = static_cast<__mmask16>(bits), mask_hi = static_cast<__mmask16>(bits >> 16);
  const __m512 masked = _mm512_set1_ps(kMasked);
  const __m512 top = _mm512_max_ps(_mm512_mask_mov_ps(masked, mask_lo, lo), _mm512_mask_mov_ps(masked, mask_hi, hi));
  const float new_max = std::max(row_max, _mm512_reduce_max_ps(top));
  const float correction = new_max > row_max ? std::exp(row_max - new_max) : 1.0f;
  const __m512 m = _mm512_set1_ps(new_max);
  const __m512 p_lo = _mm512_maskz_mov_ps(mask_lo, exp_nonpositive(_mm512_sub_ps(lo, m)));
  const __m512 p_hi = _mm512_maskz_mov_ps(mask_hi, exp_nonpositive(_mm512_sub_ps(hi, m)));
  row_sum = row_sum * correction + _mm512_reduce_add_ps(_mm512_add_ps(p_lo, p_hi));
  row_max = new_max;
  if (correction != 1.0f) {
    const __m512 c = _mm512_set1_ps(correction);
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), c));
  }
  lo = p_lo;
  hi = p_hi;
}

// The same, returning the probabilities as bfloat16 pairs (p[2k], p[2k + 1]).
template <int D>
inline __m512i fold32(__m512 lo, __m512 hi, int valid, float& row_max, float& row_sum, float* acc, int first = 0) {
  fold32_float<D>(lo, hi, valid, row_max, row_sum, acc, first);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // low half from the first 16 keys
}

// A bfloat16 chunk's 32 values, widened in fold order: `lo` the low halves of its 128-bit lanes
// and `hi` the high ones, which is the accumulators' permuted order (permuted_dim), as the V pairs' interleave
// leaves it. Exact: each float32 is its bfloat16 with 16 zero bits below.
inline void widen_permuted(__m512i chunk, __m512& lo, __m512& hi) {
  const __m512i zero = _mm512_setzero_si512();
  lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, chunk));
  hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, chunk));
}

}  // namespace frame_cpu_paged
#endif
