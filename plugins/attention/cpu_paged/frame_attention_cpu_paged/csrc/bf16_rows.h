// The bfloat16 path's row kernels: one KV head's rows against one 32-key step, the V pairs interleaved and the K
// pairs transposed for them, the softmax folded in (finish_row, fold_rows), and the rows written back in head_dim
// order.
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
    int valid(int64_t r) const { return valid_of_token(r / groups); }
    int first(int64_t r) const { return first_of_token(r / groups); }
    // The same by the row's token (its index among the item's tokens).
    int valid_of_token(int64_t t) const { return static_cast<int>(std::min<int64_t>(n, first_pos + t - k0 + 1)); }
    int first_of_token(int64_t t) const {
      return window > 0 ? static_cast<int>(std::clamp<int64_t>(first_pos + t - window + 1 - k0, 0, kKeys)) : 0;
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

  // One decode row's online-softmax update with a step's scores (lo: keys 0-15, hi: 16-31; it sees the keys
  // [first, valid)), then acc += P.V over them.
  void finish_row(int64_t row, __m512 lo, __m512 hi, int valid, int first) {
    alignas(64) uint32_t pairs[1][kKeys / 2];
    _mm512_store_si512(pairs[0], fold32<D>(scores(lo), scores(hi), valid, max_[row], sum_[row],
                                           acc_.data() + row * D, first));  // zero past the row's valid keys
    const float rescaled = 1.0f;  // fold32 scaled the accumulator already
    accumulate_rows<1>(row, 1, pairs, &rescaled, &valid);
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

  // Prefill tiles: sixteen rows a block, their 32 scores eight rows at a time as sixteen chains over the transposed
  // key pairs (vdpbf16ps' latency needs about twelve in flight on Zen 5: with four rows' eight chains the scores
  // took more time than P.V's same count of instructions), the sixteen rows' softmax steps together (fold_rows),
  // then P.V a few rows at a time.
  // Rows a prefill tile block takes: its scores eight rows at a time, its softmax step in one fold_rows call.
  static constexpr int kTileRows = 16;

  __attribute__((noinline)) void tile_rows(const HeadState& head) {
    constexpr int kRows = kTileRows;
    // Rows whose token lies before the step's keys see none of them (rows are ordered by token).
    const int64_t first_seeing = std::max<int64_t>(0, (head.k0 - head.first_pos) * head.groups) / 8 * 8;
    for (int64_t rb = first_seeing; rb < head.rows; rb += kRows) {
      __m512 lo[kRows], hi[kRows];
      for (int half = 0; half < kRows; half += 8) {
        const auto* q = reinterpret_cast<const int32_t*>(queries_.data() + (head.row0 + rb + half) * D);
        __m512 l[8], h[8];
        for (int b = 0; b < 8; ++b) l[b] = h[b] = _mm512_setzero_ps();
        if (rb + half < head.rows) {
          for (int d2 = 0; d2 < D / 2; ++d2) {
            const __m512bh k_lo = (__m512bh)_mm512_loadu_si512(keys_t_.data() + d2 * kKeys);
            const __m512bh k_hi = (__m512bh)_mm512_loadu_si512(keys_t_.data() + d2 * kKeys + 16);
            for (int b = 0; b < 8; ++b) {
              const __m512bh qb = (__m512bh)_mm512_set1_epi32(q[b * D / 2 + d2]);
              l[b] = _mm512_dpbf16_ps(l[b], qb, k_lo);
              h[b] = _mm512_dpbf16_ps(h[b], qb, k_hi);
            }
          }
        }
        for (int b = 0; b < 8; ++b) {
          lo[half + b] = l[b];
          hi[half + b] = h[b];
        }
      }
      const int count = static_cast<int>(std::min<int64_t>(kRows, head.rows - rb));
      alignas(64) uint32_t pairs[kRows][kKeys / 2];
      alignas(64) float corrections[kRows];
      int most[kRows];
      fold_rows(head, rb, count, lo, hi, pairs, corrections, most);
      constexpr int kPv = std::clamp(256 / D, 1, 4);  // rows whose accumulators fit in the registers together
      for (int b = 0; b < count; b += kPv)
        accumulate_rows<kPv>(head.row0 + rb + b, std::min(kPv, count - b), pairs + b, corrections + b, most + b);
      issue_prefetches(kPrefetchBurst);
    }
  }

  // The online-softmax step of sixteen rows at once (rows rb.. of the head; `count` of them exist): each row's
  // scores to probabilities (as bfloat16 pairs, zero outside the keys it sees), its max and sum updated, and the
  // factor its accumulator must be scaled by. Eight rows' maxima and sums sit in the lanes of one vector, so the
  // horizontal reductions are one transposing pass per eight rows (reduce8) and the state one load and store,
  // where a row at a time took a shuffle chain and a scalar update through memory (40% of a tile's time before). A
  // row that sees none of the step's keys, or a padding row, keeps its state (factor 1, zero probabilities).
  // `most[b]`: how many keys row b's pairs cover. Each row takes the same arithmetic whichever lane it sits in.
  // Sixteen rows rather than eight: the step is a chain (the scores' maxima, then the exponentials, then the sums)
  // that the core cannot overlap with the multiplies around it, and two blocks' chains side by side take about as
  // long as one. Out of line, its loops unrolled: inlined into tile_rows its registers spilled (1.4x slower), and
  // as rolled loops its exponentials did not overlap.
  __attribute__((noinline)) void fold_rows(const HeadState& head, int64_t rb, int count, const __m512* lo,
                                           const __m512* hi, uint32_t (*pairs)[kKeys / 2], float* corrections,
                                           int* most) {
    constexpr int kRows = kTileRows, kGroups = kRows / 8;
    const __m512 masked = _mm512_set1_ps(kMasked);
    __mmask16 mask_lo[kRows], mask_hi[kRows];
    __m512 s_lo[kRows], s_hi[kRows], top[kRows];
    int64_t token = rb / head.groups, group = rb % head.groups;  // row rb + b's, kept without a division a row
#pragma GCC unroll 16
    for (int b = 0; b < kRows; ++b) {
      const int valid = b < count ? head.valid_of_token(token) : 0;
      const int first = b < count ? head.first_of_token(token) : 0;
      if (++group == head.groups) {
        group = 0;
        ++token;
      }
      const uint32_t bits = valid <= first ? 0u
                            : (valid >= 32 ? 0xffffffffu : (1u << valid) - 1u) & ~((1u << first) - 1u);
      most[b] = valid <= first ? 0 : valid;
      mask_lo[b] = static_cast<__mmask16>(bits);
      mask_hi[b] = static_cast<__mmask16>(bits >> 16);
      s_lo[b] = scores(lo[b]);
      s_hi[b] = scores(hi[b]);
      top[b] = _mm512_max_ps(_mm512_mask_mov_ps(masked, mask_lo[b], s_lo[b]),
                             _mm512_mask_mov_ps(masked, mask_hi[b], s_hi[b]));
    }
    __m256 new_max[kGroups], factor[kGroups];
    __mmask8 live[kGroups];
#pragma GCC unroll 2
    for (int g = 0; g < kGroups; ++g) {
      const int rows = std::clamp(count - 8 * g, 0, 8);
      live[g] = static_cast<__mmask8>((1u << rows) - 1u);
      const __m256 old_max = _mm256_mask_loadu_ps(_mm256_set1_ps(kMasked), live[g], max_.data() + head.row0 + rb + 8 * g);
      new_max[g] = _mm256_max_ps(old_max, reduce8(top + 8 * g, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); }));
      // exp(old - new) where the max rose, else exactly 1.
      const __mmask8 rose = _mm256_cmp_ps_mask(new_max[g], old_max, _CMP_GT_OQ);
      factor[g] = _mm256_mask_blend_ps(
          rose, _mm256_set1_ps(1.0f),
          _mm512_castps512_ps256(exp_nonpositive(_mm512_zextps256_ps512(_mm256_sub_ps(old_max, new_max[g])))));
    }
    __m512 p[kRows];
#pragma GCC unroll 16
    for (int b = 0; b < kRows; ++b) {
      const __m512 m = _mm512_permutexvar_ps(_mm512_set1_epi32(b % 8), _mm512_zextps256_ps512(new_max[b / 8]));
      const __m512 p_lo = _mm512_maskz_mov_ps(mask_lo[b], exp_nonpositive(_mm512_sub_ps(s_lo[b], m)));
      const __m512 p_hi = _mm512_maskz_mov_ps(mask_hi[b], exp_nonpositive(_mm512_sub_ps(s_hi[b], m)));
      _mm512_store_si512(pairs[b], (__m512i)_mm512_cvtne2ps_pbh(p_hi, p_lo));  // low half from the first 16 keys
      p[b] = _mm512_add_ps(p_lo, p_hi);
    }
#pragma GCC unroll 2
    for (int g = 0; g < kGroups; ++g) {
      const __m256 step_sum = reduce8(p + 8 * g, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
      float* row_sum = sum_.data() + head.row0 + rb + 8 * g;
      const __m256 old_sum = _mm256_mask_loadu_ps(_mm256_setzero_ps(), live[g], row_sum);
      _mm256_mask_storeu_ps(row_sum, live[g], _mm256_fmadd_ps(old_sum, factor[g], step_sum));
      _mm256_mask_storeu_ps(max_.data() + head.row0 + rb + 8 * g, live[g], new_max[g]);
      _mm256_store_ps(corrections + 8 * g, factor[g]);
    }
  }

  // acc = acc * factor + P.V over the step's keys for `count` (at most R) adjacent rows: the V pairs (vpairs_)
  // loaded once for the rows, and R x D / 16 independent accumulator chains. Pairs past a row's keys are zero, and
  // R rows of `pairs` are read even where fewer exist (fold_rows zeroes a padding row's).
  template <int R>
  void accumulate_rows(int64_t row, int count, const uint32_t (*pairs)[kKeys / 2], const float* factors,
                       const int* most_keys) {
    int most = 0;
    for (int b = 0; b < count; ++b) most = std::max(most, most_keys[b]);
    if (most == 0) return;  // no row saw a key: their factors are 1
    float* acc = acc_.data() + row * D;
    __m512 sums[R][D / 16];
    for (int b = 0; b < R; ++b) {
      const __m512 factor = _mm512_set1_ps(b < count ? factors[b] : 0.0f);
      for (int v = 0; v < D / 16; ++v)
        sums[b][v] = b < count ? _mm512_mul_ps(_mm512_loadu_ps(acc + b * D + 16 * v), factor) : _mm512_setzero_ps();
    }
    for (int k = 0; k < (most + 1) / 2; ++k) {
      __m512bh vk[D / 16];
      for (int v = 0; v < D / 16; ++v)
        vk[v] = (__m512bh)_mm512_loadu_si512(vpairs_.data() + (k * (D / 16) + v) * 16);
      for (int b = 0; b < R; ++b) {
        const __m512bh pk = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[b][k]));
        for (int v = 0; v < D / 16; ++v) sums[b][v] = _mm512_dpbf16_ps(sums[b][v], pk, vk[v]);
      }
    }
    for (int b = 0; b < count; ++b)
      for (int v = 0; v < D / 16; ++v) _mm512_storeu_ps(acc + b * D + 16 * v, sums[b][v]);
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
