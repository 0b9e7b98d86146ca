// Shared by the float and bfloat16 paths of the paged attention kernel: constants, the exp polynomial, the
// problem description, and the key prefetch.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace frame_cpu_paged {

constexpr int kDirectMaxRows = 8;   // up to this many rows an item takes the direct (decode) path
constexpr int kChunk = 16;          // keys per online-softmax step of the float path
constexpr float kMasked = -1e30f;   // finite "minus infinity": the exp below clamps it to ~0 and never NaNs

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
// The same in sixteen lanes.
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
  // p * 2^n in one instruction, where building 2^n's bits took three more in the exponentials' dependency chain
  // (the same product: both scale by an exact power of two).
  return _mm512_scalef_ps(p, n);
}

#endif

struct WorkItem {
  int32_t seq;
  int32_t first_token;  // index among the sequence's new tokens
  int32_t num_tokens;
};

// The float path: one KV head's rows of an item: queries, accumulators, where the first row's token sits, and the layer's
// sliding window and soft-cap (0: none).
struct HeadRows {
  const float* q;
  float* acc;
  float* max;
  float* sum;
  int64_t rows, groups, first_pos;
  int64_t window;
  float softcap;
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
  int64_t window;   // a query at position p sees keys (p - window, p]; 0: every key up to p
  float softcap;    // scores become softcap * tanh(score / softcap) before the softmax; 0: none
  // Elements of one (token, KV head) row in the pool: head_dim, or head_dim + 4 in a quantized pool (int8 / fp8
  // codes, then the row's float32 scale in the next 4 bytes).
  int64_t row;
  // [seqs]: whose new tokens are prompt tokens (AttentionMetadata.prompt); null where the caller did not say.
  const bool* prompt = nullptr;

  // A window or a soft-cap: the float path's generic loops serve them (its AVX-512 and AVX2 chunks assume
  // neither); the bfloat16 path does both itself.
  bool limited() const { return window > 0 || softcap > 0.0f; }
  bool is_prompt(int64_t seq) const { return prompt != nullptr && prompt[seq]; }
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
  const int64_t row_bytes = p.kv_heads * p.row * static_cast<int64_t>(sizeof(cache_t));
  const int64_t base = (table[pos / p.block_size] * p.block_size + pos % p.block_size) * p.kv_heads * p.row;
  const char* k = reinterpret_cast<const char*>(p.k_cache + base);
  const char* v = reinterpret_cast<const char*>(p.v_cache + base);
  for (int64_t b = 0; b < row_bytes; b += 64) {
    prefetch_line(k + b);
    prefetch_line(v + b);
  }
}

// A quantized pool's code types: int8 (value = code * scale) and fp8 e4m3 (value = float(code) * scale).
template <typename cache_t>
constexpr bool kQuantized = std::is_same_v<cache_t, int8_t> || std::is_same_v<cache_t, c10::Float8_e4m3fn>;
constexpr int64_t kScaleBytes = 4;

// The float32 scale stored after a quantized row's head_dim codes (1 for a float pool, which has none).
template <typename cache_t>
inline float row_scale(const cache_t* row, int64_t dim) {
  if constexpr (kQuantized<cache_t>) {
    float scale;
    std::memcpy(&scale, reinterpret_cast<const char*>(row + dim), sizeof scale);
    return scale;
  } else {
    return 1.0f;
  }
}

// An fp8 e4m3 code as a float, in arithmetic the compiler vectorises: the code's exponent and mantissa bits moved to
// a float's (bits 23-26 and 20-22) read as a float of exponent bias 127, scaled by 2^(127 - 7) to e4m3's bias 7;
// e4m3's subnormals land on float subnormals and come out exact. The one NaN code (never written: codes stay within
// +-448) is not special-cased.
inline float fp8_e4m3_to_float(uint8_t code) {
  const uint32_t magnitude = static_cast<uint32_t>(code & 0x7F) << 20;
  float f;
  std::memcpy(&f, &magnitude, sizeof f);
  f *= 0x1p120f;
  return (code & 0x80) ? -f : f;
}

}  // namespace frame_cpu_paged
