// The float path's per-chunk kernels: one 16-key chunk against one KV head's rows (HeadRows), the online softmax
// folded in. simd_chunk for AVX-512 (head_dim a multiple of 16) and generic_chunk's loops for everything else (other
// head sizes, windows, soft-caps, other ISAs); both give a row's score against a key the same float whether the
// row came in a decode or a prefill tile. The AVX2 versions are in avx2_path.h; float_item.h calls them.
#pragma once

#include "common.h"

#include <algorithm>
#include <cmath>

namespace frame_cpu_paged {

#if defined(__AVX512F__)
// Online-softmax update of one row with this chunk's scores (lanes below `valid` are real keys): returns the
// probabilities to multiply V by (zero in the padding lanes) and rescales the row's accumulator.
template <int D>
inline __m512 fold16(__m512 scores, int valid, float& row_max, float& row_sum, float* acc) {
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
  const float new_max = std::max(row_max, _mm512_mask_reduce_max_ps(mask, scores));
  const float correction = new_max > row_max ? std::exp(row_max - new_max) : 1.0f;
  const __m512 probs = _mm512_maskz_mov_ps(mask, exp_nonpositive(_mm512_sub_ps(scores, _mm512_set1_ps(new_max))));
  row_sum = row_sum * correction + _mm512_reduce_add_ps(probs);
  row_max = new_max;
  if (correction != 1.0f) {
    const __m512 c = _mm512_set1_ps(correction);
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), c));
  }
  return probs;
}

// A row's score against a key is the same float whichever path computes it, so a token's attention does not depend
// on how many rows its step brought (a decode, a one-token prefix-cache miss or a prefill tile): with weights
// whose activations are rounded to int8 per block (GGUF's packed kernels), a last-bit difference flips roundings
// and, on SmolLM2 Q4_1, changed greedy answers between identical requests. Both paths sum the D products as 16
// lanes (lane l: products l, l + 16, ..., in that order) and then the lanes pairwise: l with l + 8, then l + 4,
// l + 2, l + 1. The direct path holds the lanes of one key in a vector (lane_tree_sum); the tile path holds one
// lane of 16 keys in a vector (lane_tree), one addition more per lane than a plain chain over D.
inline float lane_tree_sum(__m512 a) {
  const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  const __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// Four rows' (q, [4][D]) lane L of 16 keys (kt, K transposed [D][kChunk]).
template <int D, int L>
inline void lane_chain(const float* q, const float* kt, __m512* out) {
  const __m512 k0 = _mm512_loadu_ps(kt + L * kChunk);
  for (int b = 0; b < 4; ++b) out[b] = _mm512_mul_ps(_mm512_set1_ps(q[b * D + L]), k0);
  for (int v = 1; v < D / 16; ++v) {
    const __m512 k = _mm512_loadu_ps(kt + (16 * v + L) * kChunk);
    for (int b = 0; b < 4; ++b) out[b] = _mm512_fmadd_ps(_mm512_set1_ps(q[b * D + 16 * v + L]), k, out[b]);
  }
}

// The sum of lanes L, L + Step, L + 2 Step, ... (below 16) as lane_tree_sum pairs them: lane_tree<D, 0, 1> is
// four rows' scores of 16 keys.
template <int D, int L, int Step>
inline void lane_tree(const float* q, const float* kt, __m512* out) {
  __m512 x[4], y[4];
  if constexpr (Step == 8) {
    lane_chain<D, L>(q, kt, x);
    lane_chain<D, L + 8>(q, kt, y);
  } else {
    lane_tree<D, L, Step * 2>(q, kt, x);
    lane_tree<D, L + Step, Step * 2>(q, kt, y);
  }
  for (int b = 0; b < 4; ++b) out[b] = _mm512_add_ps(x[b], y[b]);
}

// acc (one row, D floats) += sum_j probs[j] * V[j] over the chunk's `valid` V rows (float, [kChunk][D]).
template <int D>
inline void accumulate_values(const float* probs, int valid, const float* vrows, float* acc) {
  __m512 sums[D / 16];
  for (int v = 0; v < D / 16; ++v) sums[v] = _mm512_loadu_ps(acc + 16 * v);
  for (int j = 0; j < valid; ++j) {
    const __m512 p = _mm512_set1_ps(probs[j]);
    for (int v = 0; v < D / 16; ++v) sums[v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vrows + j * D + 16 * v), sums[v]);
  }
  for (int v = 0; v < D / 16; ++v) _mm512_storeu_ps(acc + 16 * v, sums[v]);
}
#endif

// Fold one chunk's scores s[0..kChunk) (real keys in [first, valid)) of a row into the running softmax; vrows
// are the chunk's V rows as float (kChunk x D).
template <int D>
inline void fold_scores(float* s, int first, int valid, float& row_max, float& row_sum, float* acc,
                        const float* vrows, int64_t dim) {
  const int64_t d_len = D > 0 ? D : dim;
  float chunk_max = kMasked;
  for (int j = 0; j < kChunk; ++j) {
    s[j] = j >= first && j < valid ? s[j] : kMasked;
    chunk_max = std::max(chunk_max, s[j]);
  }
  const float new_max = std::max(row_max, chunk_max);
  const float correction = exp_nonpositive(row_max - new_max);
  float p_sum = 0.0f;
  for (int j = 0; j < kChunk; ++j) {
    s[j] = j >= first && j < valid ? exp_nonpositive(s[j] - new_max) : 0.0f;
    p_sum += s[j];
  }
  row_sum = row_sum * correction + p_sum;
  row_max = new_max;
  for (int64_t d = 0; d < d_len; ++d) acc[d] *= correction;
  for (int j = first; j < valid; ++j) {
    const float p = s[j];
    const float* v = vrows + j * d_len;
    for (int64_t d = 0; d < d_len; ++d) acc[d] += p * v[d];
  }
}

template <int D>
inline float dot(const float* a, const float* b, int64_t dim) {
  const int64_t d_len = D > 0 ? D : dim;
  float lanes[16] = {0.0f};
  int64_t d = 0;
  for (; d + 16 <= d_len; d += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += a[d + l] * b[d + l];
  float total = 0.0f;
  for (; d < d_len; ++d) total += a[d] * b[d];
  for (int l = 0; l < 16; ++l) total += lanes[l];
  return total;
}

// One row's scores against the chunk's 16 keys (kt, K transposed [dim][kChunk]), each the same float as dot<D>
// gives it (the direct path's), so a token's attention does not depend on how its step split the prompt: the
// products past the last whole 16 first, then each lane l (products l, l + 16, ...) summed apart and added in turn.
template <int D>
inline void tile_scores(const float* q, const float* kt, int64_t dim, float* scores) {
  const int64_t d_len = D > 0 ? D : dim, whole = d_len / 16 * 16;
  for (int j = 0; j < kChunk; ++j) scores[j] = 0.0f;
  for (int64_t d = whole; d < d_len; ++d) {
    const float qd = q[d];
    for (int j = 0; j < kChunk; ++j) scores[j] += qd * kt[d * kChunk + j];
  }
  for (int64_t l = 0; l < 16; ++l) {
    float lane[kChunk] = {0.0f};
    for (int64_t d = l; d < whole; d += 16) {
      const float qd = q[d];
      for (int j = 0; j < kChunk; ++j) lane[j] += qd * kt[d * kChunk + j];
    }
    for (int j = 0; j < kChunk; ++j) scores[j] += lane[j];
  }
}

// One 16-key chunk for one KV head's rows, generic loops. kt: K rows [kChunk][dim] (direct) or K transposed
// [dim][kChunk] (tile); vr: V rows [kChunk][dim].
template <int D>
void generic_chunk(const HeadRows& h, const float* kt, const float* vr, int64_t k0, int n, bool direct,
                   int64_t dim) {
  float scores[kChunk];
  for (int64_t r = 0; r < h.rows; ++r) {
    const int64_t pos = h.first_pos + r / h.groups;
    const int valid = static_cast<int>(std::min<int64_t>(n, pos - k0 + 1));
    // With a window the row sees keys from pos - window + 1 on: those before it in this chunk are masked.
    const int first = h.window > 0 ? static_cast<int>(std::clamp<int64_t>(pos - h.window + 1 - k0, 0, kChunk)) : 0;
    if (valid <= first) continue;
    const float* q = h.q + r * dim;
    if (direct) {
      for (int j = 0; j < kChunk; ++j) scores[j] = j < valid ? dot<D>(q, kt + j * dim, dim) : 0.0f;
    } else {
      tile_scores<D>(q, kt, dim, scores);
    }
    if (h.softcap > 0.0f)
      for (int j = first; j < valid; ++j) scores[j] = h.softcap * std::tanh(scores[j] / h.softcap);
    fold_scores<D>(scores, first, valid, h.max[r], h.sum[r], h.acc + r * dim, vr, dim);
  }
}

#if defined(__AVX512F__)
// The same with AVX-512 (head_dim a multiple of 16). Direct path: one dot product per key and row. Tile path:
// four rows' 16 scores as four independent FMA chains over the transposed chunk.
template <int D>
void simd_chunk(const HeadRows& h, const float* kt, const float* vr, int64_t k0, int n, bool direct) {
  alignas(64) float probs[kChunk];
  auto finish_row = [&](int64_t r, __m512 scores, int valid) {
    float* acc = h.acc + r * D;
    _mm512_store_ps(probs, fold16<D>(scores, valid, h.max[r], h.sum[r], acc));
    accumulate_values<D>(probs, valid, vr, acc);
  };
  auto valid_keys = [&](int64_t r) {
    return static_cast<int>(std::min<int64_t>(n, h.first_pos + r / h.groups - k0 + 1));
  };
  if (direct) {
    alignas(64) float dots[kChunk];
    for (int64_t r = 0; r < h.rows; ++r) {
      const int valid = valid_keys(r);
      if (valid <= 0) continue;
      const float* q = h.q + r * D;
      __m512 qv[D / 16];
      for (int v = 0; v < D / 16; ++v) qv[v] = _mm512_loadu_ps(q + 16 * v);
      for (int j = 0; j < valid; ++j) {
        __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kt + j * D));
        for (int v = 1; v < D / 16; ++v) a = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(kt + j * D + 16 * v), a);
        dots[j] = lane_tree_sum(a);
      }
      finish_row(r, _mm512_maskz_load_ps(static_cast<__mmask16>((1u << valid) - 1u), dots), valid);
    }
    return;
  }
  // Rows whose token lies before the chunk see none of its keys (rows are ordered by token).
  const int64_t first_seeing = std::max<int64_t>(0, (k0 - h.first_pos) * h.groups) / 4 * 4;
  for (int64_t rb = first_seeing; rb < h.rows; rb += 4) {
    __m512 scores[4];
    lane_tree<D, 0, 1>(h.q + rb * D, kt, scores);
    for (int b = 0; b < 4 && rb + b < h.rows; ++b) {
      const int valid = valid_keys(rb + b);
      if (valid > 0) finish_row(rb + b, scores[b], valid);
    }
  }
}
#endif

}  // namespace frame_cpu_paged
