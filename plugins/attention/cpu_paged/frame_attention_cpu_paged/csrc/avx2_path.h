// The float path's per-chunk work with AVX2 and FMA, for x86 CPUs without AVX-512 (AMD Zen 2/3, Intel client
// parts): head_dim a multiple of 8, no window or soft-cap (those take the generic loops). Sixteen keys' scores are
// two ymm vectors.
// - Decode rows (direct): eight keys at a time, one accumulator per key along head_dim, reduced to one vector of
//   eight scores by a transposing hadd tree.
// - Prefill tiles: four rows' sixteen scores as eight independent FMA chains over the transposed chunk, each key
//   pair of vectors loaded once for the four rows, one head_dim lane at a time (lane_tree), so a score is the same
//   float as the decode path's.
// - P V: each row's accumulator stays in registers (64 floats at a time) over the chunk's keys.
// Against the compiler-vectorised generic loops, float32, one Zen 3 core, KV from memory
// (benchmarks/attention_kernels.py --dtype float32 --layers 30), ms per layer: decode 8 x ~300 keys 0.67 -> 0.41,
// 64 x ~300 7.5 -> 5.3; prefill 9 x 225 tokens 162 -> 22, one of 2,000 tokens 1279 -> 157.
#pragma once

#include "common.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace frame_cpu_paged::avx2 {

// exp(x) for x <= 0 in eight lanes: the scalar exp_nonpositive's polynomial.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 t = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.6931471805599453f), x);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Eight vectors to one: lane j holds the sum of a[j]'s lanes, paired as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
inline __m256 reduce8(const __m256* a) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  // s0123 holds a[0..3]'s low-half sums in its low 128 bits and their high-half sums in its high 128 bits.
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// All ones in the lanes whose key index (lane + offset) is below `valid`.
inline __m256 keys_below(int valid, int offset) {
  const __m256i index = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(offset));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(valid), index));
}

// Online-softmax update of one row with a chunk's sixteen scores (keys below `valid` are real): writes the
// probabilities to multiply V by (zero past `valid`) and rescales the row's accumulator.
template <int D>
inline void fold16(__m256 lo, __m256 hi, int valid, float& row_max, float& row_sum, float* acc, float* probs) {
  const __m256 real_lo = keys_below(valid, 0), real_hi = keys_below(valid, 8);
  const __m256 masked = _mm256_set1_ps(kMasked);
  lo = _mm256_blendv_ps(masked, lo, real_lo);
  hi = _mm256_blendv_ps(masked, hi, real_hi);
  const float new_max = std::max(row_max, horizontal_max(_mm256_max_ps(lo, hi)));
  const float correction = new_max > row_max ? std::exp(row_max - new_max) : 1.0f;
  const __m256 m = _mm256_set1_ps(new_max);
  const __m256 p_lo = _mm256_and_ps(real_lo, exp_nonpositive(_mm256_sub_ps(lo, m)));
  const __m256 p_hi = _mm256_and_ps(real_hi, exp_nonpositive(_mm256_sub_ps(hi, m)));
  _mm256_storeu_ps(probs, p_lo);
  _mm256_storeu_ps(probs + 8, p_hi);
  row_sum = row_sum * correction + horizontal_sum(_mm256_add_ps(p_lo, p_hi));
  row_max = new_max;
  if (correction != 1.0f) {
    const __m256 c = _mm256_set1_ps(correction);
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(acc + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), c));
  }
}

// acc (one row, D floats) += sum_j probs[j] * V[j] over the chunk's `valid` V rows, 64 floats of the row at a
// time so the sums stay in registers.
template <int D>
inline void accumulate_values(const float* probs, int valid, const float* const* vrows, float* acc) {
  constexpr int kPart = D < 64 ? D : 64;
  for (int part = 0; part < D; part += kPart) {
    __m256 sums[kPart / 8];
    for (int v = 0; v < kPart / 8; ++v) sums[v] = _mm256_loadu_ps(acc + part + 8 * v);
    for (int j = 0; j < valid; ++j) {
      const __m256 p = _mm256_broadcast_ss(probs + j);
      const float* row = vrows[j] + part;
      for (int v = 0; v < kPart / 8; ++v) sums[v] = _mm256_fmadd_ps(p, _mm256_loadu_ps(row + 8 * v), sums[v]);
    }
    for (int v = 0; v < kPart / 8; ++v) _mm256_storeu_ps(acc + part + 8 * v, sums[v]);
  }
}

// A row's score against a key must be the same float on the direct (decode) and the tile (prefill) path, or a
// token's attention changes with how its prompt was split into steps (a prefix-cache hit leaves the last tokens to a
// step of their own; see the AVX-512 lane_tree_sum in float_chunk.h). The direct path sums the D products as 8
// lanes (lane l: products l, l + 8, ..., in that order, one FMA chain from zero) and reduce8 then adds the lanes
// pairwise, l with l + 1, then l + 2, then l + 4. The tile path keeps one lane of 16 keys in two vectors per row
// and adds those lanes in the same tree: 7 additions per row and key pair more than one chain over D.
template <int D, int L>
inline void lane_chain(const float* q, const float* kt, __m256 (&out)[4][2]) {
  for (int b = 0; b < 4; ++b) out[b][0] = out[b][1] = _mm256_setzero_ps();
  for (int d = L; d < D; d += 8) {
    const __m256 k_lo = _mm256_loadu_ps(kt + d * kChunk), k_hi = _mm256_loadu_ps(kt + d * kChunk + 8);
    for (int b = 0; b < 4; ++b) {
      const __m256 qd = _mm256_broadcast_ss(q + b * D + d);
      out[b][0] = _mm256_fmadd_ps(qd, k_lo, out[b][0]);
      out[b][1] = _mm256_fmadd_ps(qd, k_hi, out[b][1]);
    }
  }
}

// The sum of lanes [L, L + Width) as reduce8 pairs them: lane_tree<D, 0, 8> is four rows' scores of 16 keys.
template <int D, int L, int Width>
inline void lane_tree(const float* q, const float* kt, __m256 (&out)[4][2]) {
  if constexpr (Width == 1) {
    lane_chain<D, L>(q, kt, out);
  } else {
    __m256 y[4][2];
    lane_tree<D, L, Width / 2>(q, kt, out);
    lane_tree<D, L + Width / 2, Width / 2>(q, kt, y);
    for (int b = 0; b < 4; ++b) {
      out[b][0] = _mm256_add_ps(out[b][0], y[b][0]);
      out[b][1] = _mm256_add_ps(out[b][1], y[b][1]);
    }
  }
}

// One 16-key chunk for one KV head's rows. Direct: k_rows, the chunk's K rows; tile: kt, K transposed [D][kChunk]
// with zeros past the chunk's keys. v_rows: its V rows. Row pointers past the chunk's `n` keys point at a real
// (finite) row: their scores are computed and masked.
template <int D>
void chunk(const HeadRows& h, const float* kt, const float* const* k_rows, const float* const* v_rows, int64_t k0,
           int n, bool direct) {
  static_assert(D % 8 == 0, "the AVX2 path takes head_dim in multiples of 8");
  alignas(32) float scores[kChunk];
  alignas(32) float probs[kChunk];
  auto valid_keys = [&](int64_t r) {
    return static_cast<int>(std::min<int64_t>(n, h.first_pos + r / h.groups - k0 + 1));
  };
  auto finish_row = [&](int64_t r, __m256 lo, __m256 hi, int valid) {
    float* acc = h.acc + r * D;
    fold16<D>(lo, hi, valid, h.max[r], h.sum[r], acc, probs);
    accumulate_values<D>(probs, valid, v_rows, acc);
  };
  if (direct) {
    for (int64_t r = 0; r < h.rows; ++r) {
      const int valid = valid_keys(r);
      if (valid <= 0) continue;
      const float* q = h.q + r * D;
      for (int j0 = 0; j0 < valid; j0 += 8) {
        __m256 a[8];
        for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
          const __m256 qv = _mm256_loadu_ps(q + d);
          for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k_rows[j0 + j] + d), a[j]);
        }
        _mm256_store_ps(scores + j0, reduce8(a));
      }
      finish_row(r, _mm256_load_ps(scores), _mm256_load_ps(scores + 8), valid);
    }
    return;
  }
  // Rows whose token lies before the chunk see none of its keys (rows are ordered by token).
  const int64_t first_seeing = std::max<int64_t>(0, (k0 - h.first_pos) * h.groups) / 4 * 4;
  for (int64_t rb = first_seeing; rb < h.rows; rb += 4) {
    __m256 s[4][2];
    lane_tree<D, 0, 8>(h.q + rb * D, kt, s);  // the query buffer is padded to whole groups of four rows
    for (int b = 0; b < 4 && rb + b < h.rows; ++b) {
      const int valid = valid_keys(rb + b);
      if (valid > 0) finish_row(rb + b, s[b][0], s[b][1], valid);
    }
  }
}

}  // namespace frame_cpu_paged::avx2
#endif
