// The bfloat16 path's row kernels: one KV head's rows against one 32-key step, the V pairs interleaved and the K
// pairs transposed for them, the softmax folded in (finish_rows), and the rows written back in head_dim order.
// Bf16Rows holds the per-thread scratch they work on and the prefetch queue they issue between pieces of compute;
// Bf16ItemRunner (bf16_path.h) walks the block table and calls them.
#pragma once

#include "amx_tiles.h"
#include "bf16_vectors.h"
#include "common.h"

#include <algorithm>
#include <vector>

#if defined(__AVX512BF16__)
namespace frame_cpu_paged {

// Per-thread scratch of the bfloat16 path and the row kernels that work on it.
template <int D>
class Bf16Rows {
 public:
  using bf16 = c10::BFloat16;

  explicit Bf16Rows(const Problem<bf16, bf16>& p) : p_(p), vpairs_(kKeys / 2 * D), keys_t_(D / 2 * kKeys) {}

 protected:
  // The next step's K/V lines of one KV head are requested a few dozen at a time between pieces of compute:
  // a burst of a hundred overflows the miss queues. With the KV coming from memory, a batch-64 decode layer
  // ran 0.90 ms with one burst per head and step, 0.79 with K and V apart, 0.68 like this.
  static constexpr int kPrefetchLines = kKeys * 2 * D * 2 / 64;
  static constexpr int kPrefetchBurst = 32;

  void queue_prefetches(const int64_t* ahead, int n_ahead, int64_t h) {
    queued_ = 0;
    issued_ = 0;
    for (int j = 0; j < n_ahead; ++j)
      for (int b = 0; b < D * 2; b += 64) {
        lines_[queued_++] = reinterpret_cast<const char*>(p_.k_cache + ahead[j] + h * D) + b;
        lines_[queued_++] = reinterpret_cast<const char*>(p_.v_cache + ahead[j] + h * D) + b;
      }
  }

  void issue_prefetches(int count) {
    const int stop = std::min(queued_, issued_ + count);
    for (; issued_ < stop; ++issued_) prefetch_line(lines_[issued_]);
  }

  struct HeadState {
    int64_t row0, rows, groups, first_pos, k0;
    int n;
    int64_t window;  // the layer's sliding window, 0: none
    // Row r sees the step's keys [first(r), valid(r)): up to its token, from its window's start.
    int valid(int64_t r) const { return static_cast<int>(std::min<int64_t>(n, first_pos + r / groups - k0 + 1)); }
    int first(int64_t r) const {
      return window > 0 ? static_cast<int>(std::clamp<int64_t>(first_pos + r / groups - window + 1 - k0, 0, kKeys))
                        : 0;
    }
  };

  void interleave_values(const uint16_t* const* values, int n) {
    for (int k = 0; k < (n + 1) / 2; ++k)
      for (int c = 0; c < D / 32; ++c) {
        const __m512i a = _mm512_loadu_si512(values[2 * k] + 32 * c);
        const __m512i b = _mm512_loadu_si512(values[2 * k + 1] + 32 * c);
        _mm512_storeu_si512(vpairs_.data() + (k * (D / 16) + 2 * c) * 16, _mm512_unpacklo_epi16(a, b));
        _mm512_storeu_si512(vpairs_.data() + (k * (D / 16) + 2 * c + 1) * 16, _mm512_unpackhi_epi16(a, b));
      }
  }

  void transpose_keys(const uint16_t* const* keys) {
    for (int j = 0; j < kKeys; ++j) {
      const auto* pairs = reinterpret_cast<const uint32_t*>(keys[j]);
      for (int d2 = 0; d2 < D / 2; ++d2) keys_t_[d2 * kKeys + j] = pairs[d2];
    }
  }

  // Raw dot products to softmax scores: times the scale, then soft-capped (cap * tanh(s / cap)) where the layer
  // caps them (Gemma 2).
  __m512 scores(__m512 dots) const {
    const __m512 s = _mm512_mul_ps(dots, _mm512_set1_ps(p_.scale));
    if (p_.softcap <= 0.0f) return s;
    const __m512 cap = _mm512_set1_ps(p_.softcap);
    return _mm512_mul_ps(cap, tanh16(_mm512_div_ps(s, cap)));
  }

  void finish_row(int64_t row, __m512 lo, __m512 hi, int valid, int first) {
    finish_rows<1>(row, &lo, &hi, &valid, &first);
  }

  // R adjacent rows' online-softmax updates with a step's scores (lo: keys 0-15, hi: 16-31), then acc += P.V over
  // the step's keys, for the R rows together: the V pairs (vpairs_, [kKeys / 2][D / 16] vectors of 16 pairs) are
  // loaded once for the R rows, and R x D / 16 independent accumulator chains hide vdpbf16ps' latency, where one
  // row's D / 16 chains could not. Each row's sums run in the same order whatever R. Every row must see a key
  // (row b the keys [first[b], valid[b])).
  template <int R>
  void finish_rows(int64_t row, const __m512* lo, const __m512* hi, const int* valid, const int* first) {
    if constexpr (R > 1 && R * D > 256) {  // the rows' accumulators would not fit in the registers
      for (int b = 0; b < R; ++b) finish_rows<1>(row + b, lo + b, hi + b, valid + b, first + b);
    } else {
      alignas(64) uint32_t pairs[R][kKeys / 2];
      int most = 0;
      for (int b = 0; b < R; ++b) {
        float* acc = acc_.data() + (row + b) * D;
        const __m512i probs = fold32<D>(scores(lo[b]), scores(hi[b]), valid[b],
                                        max_[row + b], sum_[row + b], acc, first[b]);
        _mm512_store_si512(pairs[b], probs);  // zero past the row's valid keys
        most = std::max(most, valid[b]);
      }
      float* acc = acc_.data() + row * D;
      __m512 sums[R][D / 16];
      for (int b = 0; b < R; ++b)
        for (int v = 0; v < D / 16; ++v) sums[b][v] = _mm512_loadu_ps(acc + b * D + 16 * v);
      for (int k = 0; k < (most + 1) / 2; ++k) {
        __m512bh vk[D / 16];
        for (int v = 0; v < D / 16; ++v)
          vk[v] = (__m512bh)_mm512_loadu_si512(vpairs_.data() + (k * (D / 16) + v) * 16);
        for (int b = 0; b < R; ++b) {
          const __m512bh pk = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[b][k]));
          for (int v = 0; v < D / 16; ++v) sums[b][v] = _mm512_dpbf16_ps(sums[b][v], pk, vk[v]);
        }
      }
      for (int b = 0; b < R; ++b)
        for (int v = 0; v < D / 16; ++v) _mm512_storeu_ps(acc + b * D + 16 * v, sums[b][v]);
    }
  }

  // direct_rows and tile_rows stay out of line: inlined into sweep(), which has two callers, GCC compiled their
  // loops worse (a batch-64 decode layer 0.70 -> 0.94 ms with the KV from memory, a 2,000-token prefill 20 -> 28).

  // Decode rows: per key a dot product along head_dim straight from the cache.
  __attribute__((noinline)) void direct_rows(const HeadState& head, const uint16_t* const* keys) {
    __m512 dots[kKeys];
    for (int64_t r = 0; r < head.rows; ++r) {
      const int valid = head.valid(r), first = head.first(r);
      if (valid <= first) continue;
      const int64_t row = head.row0 + r;
      __m512bh q[D / 32];
      for (int c = 0; c < D / 32; ++c) q[c] = (__m512bh)_mm512_loadu_si512(queries_.data() + row * D + 32 * c);
      for (int j = 0; j < kKeys; ++j) {
        __m512 a = _mm512_setzero_ps();
        if (j < valid)
          for (int c = 0; c < D / 32; ++c)
            a = _mm512_dpbf16_ps(a, q[c], (__m512bh)_mm512_loadu_si512(keys[j] + 32 * c));
        dots[j] = a;
      }
      finish_row(row, reduce16(dots), valid > 16 ? reduce16(dots + 16) : _mm512_setzero_ps(), valid, first);
      issue_prefetches(kPrefetchBurst);
    }
  }

  // Decode rows on float32 FMAs, K and V widened in registers once per key for all the rows (widen_permuted, so
  // the accumulators keep the permuted order the other paths use): where vdpbf16ps issues at half the FMA rate
  // this runs a batch-64 decode layer's keys at a third of direct_rows' instructions' time.
  void float_rows(const HeadState& head, const uint16_t* const* keys, const uint16_t* const* values) {
    switch (head.rows) {
      case 1: return float_rows_of<1>(head, keys, values);
      case 2: return float_rows_of<2>(head, keys, values);
      case 3: return float_rows_of<3>(head, keys, values);
      case 4: return float_rows_of<4>(head, keys, values);
      case 5: return float_rows_of<5>(head, keys, values);
      case 6: return float_rows_of<6>(head, keys, values);
      case 7: return float_rows_of<7>(head, keys, values);
      default: return float_rows_of<8>(head, keys, values);
    }
  }

  template <int R>
  __attribute__((noinline)) void float_rows_of(const HeadState& head, const uint16_t* const* keys,
                                               const uint16_t* const* values) {
    static_assert(R <= kDirectMaxRows, "direct items have at most kDirectMaxRows rows");
    constexpr int V = D / 16;                 // float vectors per row
    constexpr int G = std::max(1, 16 / V);    // rows whose accumulators fit in registers together
    alignas(64) float probs[R][kKeys];
    __m512 dots[R][kKeys];
    __m512 q[R][V];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < D / 32; ++c)
        widen_permuted(_mm512_loadu_si512(queries_.data() + (head.row0 + r) * D + 32 * c), q[r][2 * c],
                       q[r][2 * c + 1]);
    for (int j = 0; j < kKeys; ++j) {
      if (j >= head.n) {
        for (int r = 0; r < R; ++r) dots[r][j] = _mm512_setzero_ps();
        continue;
      }
      __m512 k[V];
      for (int c = 0; c < D / 32; ++c) widen_permuted(_mm512_loadu_si512(keys[j] + 32 * c), k[2 * c], k[2 * c + 1]);
      for (int r = 0; r < R; ++r) {
        __m512 a = _mm512_mul_ps(q[r][0], k[0]);
        for (int v = 1; v < V; ++v) a = _mm512_fmadd_ps(q[r][v], k[v], a);
        dots[r][j] = a;
      }
    }
    for (int r = 0; r < R; ++r) {
      const int valid = head.valid(r), first = head.first(r);
      __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
      if (valid > first) {
        lo = scores(reduce16(dots[r]));
        hi = head.n > 16 ? scores(reduce16(dots[r] + 16)) : _mm512_setzero_ps();
        fold32_float<D>(lo, hi, valid, max_[head.row0 + r], sum_[head.row0 + r], acc_.data() + (head.row0 + r) * D,
                        first);
      }
      _mm512_store_ps(probs[r], lo);
      _mm512_store_ps(probs[r] + 16, hi);
    }
    issue_prefetches(kPrefetchBurst);
    for (int g = 0; g < R; g += G) {
      constexpr int kRows = G < R ? G : R;
      __m512 acc[kRows][V];
      const int rows = std::min(kRows, R - g);
      for (int r = 0; r < kRows; ++r)
        for (int v = 0; v < V; ++v)
          acc[r][v] = r < rows ? _mm512_loadu_ps(acc_.data() + (head.row0 + g + r) * D + 16 * v) : _mm512_setzero_ps();
      for (int j = 0; j < head.n; ++j) {
        __m512 x[V];
        for (int c = 0; c < D / 32; ++c)
          widen_permuted(_mm512_loadu_si512(values[j] + 32 * c), x[2 * c], x[2 * c + 1]);
        for (int r = 0; r < kRows; ++r) {
          const __m512 p = _mm512_set1_ps(r < rows ? probs[g + r][j] : 0.0f);
          for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(p, x[v], acc[r][v]);
        }
      }
      for (int r = 0; r < rows; ++r)
        for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc_.data() + (head.row0 + g + r) * D + 16 * v, acc[r][v]);
    }
  }

#if FRAME_PAGED_AMX
  // Prefill tiles and cascade prefixes on AMX: 16 rows at a time, their 32 scores one tile product against the
  // transposed keys, the softmax on vectors, P.V into the accumulators.
  __attribute__((noinline)) void amx_tile_rows(const HeadState& head) {
    alignas(64) float s[16 * kKeys];
    alignas(64) uint32_t probs[16][16];
    // Rows whose token lies before the step's keys see none of them (rows are ordered by token).
    const int64_t first_seeing = std::max<int64_t>(0, (head.k0 - head.first_pos) * head.groups) / 16 * 16;
    for (int64_t rb = first_seeing; rb < head.rows; rb += 16) {
      const int64_t rows = std::min<int64_t>(16, head.rows - rb);
      amx::tile_scores<D>(queries_.data() + (head.row0 + rb) * D, keys_t_.data(), s);
      for (int64_t r = 0; r < 16; ++r) {
        const int valid = r < rows ? head.valid(rb + r) : 0, first = r < rows ? head.first(rb + r) : 0;
        if (valid <= first) {
          _mm512_store_si512(probs[r], _mm512_setzero_si512());
          continue;
        }
        const int64_t row = head.row0 + rb + r;
        const __m512i pairs = fold32<D>(scores(_mm512_load_ps(s + r * kKeys)),
                                        scores(_mm512_load_ps(s + r * kKeys + 16)), valid, max_[row],
                                        sum_[row], acc_.data() + row * D, first);
        _mm512_store_si512(probs[r], pairs);
      }
      amx::accumulate<D>(&probs[0][0], vpairs_.data(), rows, acc_.data() + (head.row0 + rb) * D);
      issue_prefetches(kPrefetchBurst);
    }
  }
#endif

  // Prefill tiles: eight rows' 32 scores as sixteen chains over the transposed key pairs (vdpbf16ps' latency
  // needs about twelve in flight on Zen 5: with four rows' eight chains the scores took more time than P.V's same
  // count of instructions), then P.V four rows at a time. Each row's sums run in the same order as with four.
  __attribute__((noinline)) void tile_rows(const HeadState& head) {
    constexpr int kRows = 8;
    // Rows whose token lies before the step's keys see none of them (rows are ordered by token).
    const int64_t first_seeing = std::max<int64_t>(0, (head.k0 - head.first_pos) * head.groups) / kRows * kRows;
    for (int64_t rb = first_seeing; rb < head.rows; rb += kRows) {
      const auto* q = reinterpret_cast<const int32_t*>(queries_.data() + (head.row0 + rb) * D);
      __m512 lo[kRows], hi[kRows];
      for (int b = 0; b < kRows; ++b) lo[b] = hi[b] = _mm512_setzero_ps();
      for (int d2 = 0; d2 < D / 2; ++d2) {
        const __m512bh k_lo = (__m512bh)_mm512_loadu_si512(keys_t_.data() + d2 * kKeys);
        const __m512bh k_hi = (__m512bh)_mm512_loadu_si512(keys_t_.data() + d2 * kKeys + 16);
        for (int b = 0; b < kRows; ++b) {
          const __m512bh qb = (__m512bh)_mm512_set1_epi32(q[b * D / 2 + d2]);
          lo[b] = _mm512_dpbf16_ps(lo[b], qb, k_lo);
          hi[b] = _mm512_dpbf16_ps(hi[b], qb, k_hi);
        }
      }
      for (int half = 0; half < kRows; half += 4) {
        const int64_t r0 = rb + half;
        if (r0 >= head.rows) break;
        int valid[4], first[4];
        bool all_see = r0 + 4 <= head.rows;
        for (int b = 0; b < 4; ++b) {
          valid[b] = r0 + b < head.rows ? head.valid(r0 + b) : 0;
          first[b] = r0 + b < head.rows ? head.first(r0 + b) : 0;
          all_see = all_see && valid[b] > first[b];
        }
        if (all_see) {
          finish_rows<4>(head.row0 + r0, lo + half, hi + half, valid, first);
        } else {
          for (int b = 0; b < 4; ++b)
            if (valid[b] > first[b])
              finish_row(head.row0 + r0 + b, lo[half + b], hi[half + b], valid[b], first[b]);
        }
      }
      issue_prefetches(kPrefetchBurst);
    }
  }

  // acc * inv rounded to bfloat16, back in head_dim order (see permuted_dim), sixteen values a store. A scalar
  // loop here took about a third of a short prompt's prefill item.
  static void write_row(const float* acc, float inv, bf16* dst) {
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512 scale = _mm512_set1_ps(inv);
    for (int c = 0; c < D / 32; ++c) {
      const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(acc + 32 * c), scale);
      const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(acc + 32 * c + 16), scale);
      auto* out = reinterpret_cast<__m256i*>(dst + 32 * c);
      _mm256_storeu_si256(out, (__m256i)_mm512_cvtneps_pbh(_mm512_permutex2var_ps(lo, first, hi)));
      _mm256_storeu_si256(out + 1, (__m256i)_mm512_cvtneps_pbh(_mm512_permutex2var_ps(lo, second, hi)));
    }
  }

  const Problem<bf16, bf16>& p_;
  std::vector<uint16_t> queries_;
  std::vector<uint32_t> vpairs_;  // the step's V, key pairs interleaved: [kKeys / 2][D / 16] vectors of 16 pairs
  std::vector<uint32_t> keys_t_;  // the step's K as [D / 2][kKeys] bfloat16 pairs (prefill tiles)
  std::vector<float> acc_, max_, sum_;
  const char* lines_[kPrefetchLines];
  int queued_ = 0, issued_ = 0;
};

}  // namespace frame_cpu_paged
#endif
