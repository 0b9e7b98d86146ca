// Shared by the float and bfloat16 paths of the paged attention kernel: constants, conversions, the
// vectorised exp and online-softmax step, the problem description, and the key prefetch.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace frame_cpu_paged {

constexpr int kChunk = 16;          // keys per online-softmax step
constexpr int kTargetRows = 192;    // query rows (tokens x grouped heads) a prefill tile aims for
constexpr int kDirectMaxRows = 8;   // up to this many rows an item takes the direct (decode) path
constexpr int kPrefetchAhead = 24;  // keys: about one chunk of compute ahead of the loads
constexpr float kMasked = -1e30f;   // finite "minus infinity": the exp below clamps it to ~0 and never NaNs

inline float to_float(float x) { return x; }
template <typename T>
inline T from_float(float x) { return static_cast<T>(x); }  // c10::BFloat16 / c10::Half round to nearest even
inline float to_float(c10::Half x) { return static_cast<float>(x); }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exp(x) for x <= 0, vectorisable (no libm call): 2^n * exp(t) with n = round(x / ln 2), |t| <= ln(2) / 2 and a
// degree-6 Taylor polynomial for exp(t) (relative error about 1e-7). Arguments below -87 return exp(-87).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float y = x * 1.4426950408889634f;
  const float n = (y + 12582912.0f) - 12582912.0f;  // round to nearest by the 1.5 * 2^23 trick
  const float t = x - n * 0.6931471805599453f;
  float p = 1.0f / 720.0f;
  p = p * t + 1.0f / 120.0f;
  p = p * t + 1.0f / 24.0f;
  p = p * t + 1.0f / 6.0f;
  p = p * t + 0.5f;
  p = p * t + 1.0f;
  p = p * t + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

#if defined(__AVX512F__)
// AVX-512 versions of the hot loops, used when head_dim is a multiple of 16 (the generic loops cover the rest).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 t = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.6931471805599453f), x);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

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

#endif

struct WorkItem {
  int32_t seq;
  int32_t first_token;  // index among the sequence's new tokens
  int32_t num_tokens;
};

template <typename cache_t, typename query_t>
struct Problem {
  const query_t* query;   // [tokens, heads, D]; token t starts at query + t * query_stride
  query_t* out;           // [tokens, heads, D]
  const cache_t* k_cache; // [blocks, block_size, kv_heads, D]
  const cache_t* v_cache;
  const int32_t* block_tables;  // [seqs, table_width]
  const int32_t* query_start;   // [seqs + 1]
  const int32_t* seq_lens;      // [seqs]
  int64_t table_width, block_size, heads, kv_heads, head_dim;
  float scale;
  int64_t query_stride;
  int64_t num_seqs;
};

// GCC 12 drops __builtin_prefetch in this file's loops (checked in the assembly), so the instruction is spelled out.
// Into L2 (t1), not L1: a key's rows are 12 lines and L1 tracks few misses; t0 was 1.3 ms per decode layer at
// batch 64, t1 0.9 ms.
inline void prefetch_line(const char* address) {
#if defined(__x86_64__)
  asm volatile("prefetcht1 %0" : : "m"(*address));
#else
  __builtin_prefetch(address, 0, 2);
#endif
}

// Ask for one key's K/V rows (every KV head) ahead of use: the blocks lie scattered in the pool, so the
// hardware prefetcher cannot guess them.
template <typename cache_t, typename query_t>
inline void prefetch_key(const Problem<cache_t, query_t>& p, const int32_t* table, int64_t pos) {
  const int64_t row_bytes = p.kv_heads * p.head_dim * static_cast<int64_t>(sizeof(cache_t));
  const int64_t base = (table[pos / p.block_size] * p.block_size + pos % p.block_size) * p.kv_heads * p.head_dim;
  const char* k = reinterpret_cast<const char*>(p.k_cache + base);
  const char* v = reinterpret_cast<const char*>(p.v_cache + base);
  for (int64_t b = 0; b < row_bytes; b += 64) {
    prefetch_line(k + b);
    prefetch_line(v + b);
  }
}

}  // namespace frame_cpu_paged
