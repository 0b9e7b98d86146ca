// The bfloat16 path: bfloat16 cache and queries, head_dim a multiple of 32, a CPU with AVX-512 BF16.
//
// Both matrix products run on vdpbf16ps, which multiplies pairs of bfloat16 exactly and sums in float32, two
// products per lane: twice the float32 FMA rate, and K/V are never widened to float.
// - Scores (Q K^T). Decode rows (direct): a dot product along head_dim per key, sixteen keys reduced at once.
//   Prefill tiles: the chunk's keys are transposed to [head_dim / 2][16] pairs, so each row's sixteen scores
//   are one chain over a broadcast query pair.
// - Values (P V). The chunk's V rows are interleaved two keys at a time (vpunpck{l,h}wd), and each row's
//   probabilities, rounded to bfloat16, multiply a key pair per instruction. The interleave happens inside
//   128-bit lanes, so the float accumulators hold head_dim in a fixed permuted order, undone when the row is
//   written out (see permuted_dim).
// The online softmax runs in float32 over 32 keys a step (two vectors), half the float path's steps.
#pragma once

#include "amx_prefill.h"
#include "amx_tiles.h"
#include "common.h"

#include <vector>

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

// Where accumulator float f sits in head_dim. Vector 2c holds the low halves of the 128-bit lanes of
// head_dim [32c, 32c + 32), vector 2c + 1 the high halves: lane 4L + i is element 8L + i, or 8L + 4 + i.
constexpr int permuted_dim(int f) {
  return 32 * (f / 32) + 8 * ((f % 16) / 4) + 4 * ((f / 16) % 2) + f % 4;
}
// write_row's permutes rely on it: head_dim 4-7 come from the high vector's lanes 0-3, 8-11 from the low's 4-7.
static_assert(permuted_dim(16) == 4 && permuted_dim(4) == 8 && permuted_dim(20) == 12 && permuted_dim(8) == 16);

constexpr int kKeys = 32;  // keys per online-softmax step: two vectors of scores

// Online-softmax update of one row with a step's scores (lo: keys 0-15, hi: 16-31; real keys below `valid`):
// turns lo and hi into the step's probabilities, zero from `valid` on, and rescales acc.
template <int D>
inline void fold32_float(__m512& lo, __m512& hi, int valid, float& row_max, float& row_sum, float* acc) {
  const uint32_t bits = valid >= 32 ? 0xffffffffu : (1u << valid) - 1u;
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
inline __m512i fold32(__m512 lo, __m512 hi, int valid, float& row_max, float& row_sum, float* acc) {
  fold32_float<D>(lo, hi, valid, row_max, row_sum, acc);
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

// Decode sequences whose block tables begin with the same blocks (a system prompt the prefix cache hands to
// every request) attend to those keys together first ("cascade" attention): all their query rows against each
// shared step of keys as one prefill-like tile, so the prefix is read, transposed and interleaved once per
// call rather than once per sequence, and scored at the tile rate. Each sequence's own item then continues
// from that softmax state over its remaining keys. The same machinery splits a lone long decode over the threads
// when a call has fewer sequences than threads (a single stream): a group of one, its prefix one work per KV head.
struct PrefixWork {
  int32_t group, head, first, count;  // one KV head's rows of members [first, first + count) of a group
};

template <int D>
struct Cascade {
  static constexpr int kMinMembers = 4;        // fewer sharers: the per-sequence path is as fast
  static constexpr int64_t kMinKeys = 128;     // shorter shared prefixes: not worth a second pass
  static constexpr int64_t kRowsPerWork = 96;  // rows (sequences x grouped heads) per piece of work

  struct Group {
    std::vector<int32_t> seqs;
    int64_t keys;  // keys [0, keys) are shared, whole blocks, before every member's query token
  };
  std::vector<Group> groups;
  std::vector<PrefixWork> work;
  std::vector<int32_t> slot;      // per sequence: its rows' place in `state`, or -1 when it is in no group
  std::vector<int64_t> shared;    // per sequence: keys its group covers
  std::vector<float> state;       // per slot, KV head and grouped head: D accumulators, max, sum
  int64_t kv_heads, groups_per_kv;

  static constexpr int64_t kRowFloats = D + 2;

  // `threads`: with fewer sequences than threads, a long decode becomes a group of its own, so its keys before
  // the last step are swept one KV head per thread (prefix) instead of all heads on one (a single stream).
  Cascade(const Problem<c10::BFloat16, c10::BFloat16>& p, int64_t num_seqs, int64_t threads)
      : slot(num_seqs, -1), shared(num_seqs, 0), kv_heads(p.kv_heads), groups_per_kv(p.heads / p.kv_heads) {
    std::vector<std::pair<int32_t, int32_t>> decodes;  // (first block, sequence)
    for (int64_t s = 0; s < num_seqs; ++s)
      if (p.query_start[s + 1] - p.query_start[s] == 1 && p.seq_lens[s] - 1 >= kMinKeys && !p.is_prompt(s))
        decodes.emplace_back(p.block_tables[s * p.table_width], static_cast<int32_t>(s));
    std::sort(decodes.begin(), decodes.end());
    int32_t next_slot = 0;
    for (size_t a = 0, b = 0; a < decodes.size(); a = b) {
      while (b < decodes.size() && decodes[b].first == decodes[a].first) ++b;
      if (b - a < static_cast<size_t>(kMinMembers)) continue;
      const int32_t* ref = p.block_tables + decodes[a].second * p.table_width;
      int64_t blocks = p.table_width;
      for (size_t m = a; m < b; ++m) {
        const int32_t seq = decodes[m].second;
        const int32_t* table = p.block_tables + seq * p.table_width;
        int64_t same = 0;
        const int64_t visible = (p.seq_lens[seq] - 1) / p.block_size;  // whole blocks before the query token
        while (same < std::min(blocks, visible) && table[same] == ref[same]) ++same;
        blocks = same;
      }
      if (blocks * p.block_size < kMinKeys) continue;
      Group group{{}, blocks * p.block_size};
      for (size_t m = a; m < b; ++m) {
        group.seqs.push_back(decodes[m].second);
        slot[decodes[m].second] = next_slot++;
        shared[decodes[m].second] = group.keys;
      }
      const int32_t per_work = static_cast<int32_t>(std::max<int64_t>(1, kRowsPerWork / groups_per_kv));
      for (int32_t h = 0; h < kv_heads; ++h)
        for (int32_t first = 0; first < static_cast<int32_t>(group.seqs.size()); first += per_work)
          work.push_back({static_cast<int32_t>(groups.size()), h, first,
                          std::min<int32_t>(per_work, static_cast<int32_t>(group.seqs.size()) - first)});
      groups.push_back(std::move(group));
    }
    if (num_seqs < threads && kv_heads > 1)
      for (const auto& [first_block, seq] : decodes) {
        if (slot[seq] >= 0) continue;
        // Whole 32-key steps only, so the item resumes exactly where its own sweep would be: the same sums.
        int64_t keys = (p.seq_lens[seq] - 1) / p.block_size * p.block_size;
        keys -= keys % kKeys;
        if (keys < kMinKeys) continue;
        slot[seq] = next_slot++;
        shared[seq] = keys;
        for (int32_t h = 0; h < kv_heads; ++h) work.push_back({static_cast<int32_t>(groups.size()), h, 0, 1});
        groups.push_back(Group{{seq}, keys});
      }
    state.assign(static_cast<size_t>(next_slot) * kv_heads * groups_per_kv * kRowFloats, 0.0f);
  }

  // The saved state of grouped head g of KV head h of sequence seq (which must be in a group).
  float* row(int32_t seq, int64_t h, int64_t g) {
    return state.data() + ((slot[seq] * kv_heads + h) * groups_per_kv + g) * kRowFloats;
  }
};

// Runs the items of one call on one thread, keeping its scratch between items.
template <int D>
class Bf16ItemRunner {
 public:
  using bf16 = c10::BFloat16;

  Bf16ItemRunner(const Problem<bf16, bf16>& p, Cascade<D>& cascade)
      : p_(p), cascade_(cascade), zeros_(D, 0), vpairs_(kKeys / 2 * D), keys_t_(D / 2 * kKeys)
#if FRAME_PAGED_AMX
        , flash_(p)
#endif
  {
#if FRAME_PAGED_AMX
    amx_ = amx::permitted();
    flash_ok_ = amx_ && amx::FlashPrefill<D>::serves(p);
#endif
  }

  // One piece of a cascade: a group's shared keys for one KV head's rows of some members; saves their state.
  void prefix(const PrefixWork& work) {
    const auto& group = cascade_.groups[work.group];
    const int64_t groups = p_.heads / p_.kv_heads, rows = work.count * groups;
    start_rows(rows);
    for (int32_t m = 0; m < work.count; ++m)
      std::memcpy(queries_.data() + m * groups * D,
                  p_.query + p_.query_start[group.seqs[work.first + m]] * p_.query_stride + work.head * groups * D,
                  groups * D * sizeof(uint16_t));
    const int32_t* table = p_.block_tables + group.seqs[0] * p_.table_width;
    // A lone decode's rows take the decode path its item would (the same sums, step for step); a group's, tiles.
    const bool direct = rows <= kDirectMaxRows;
#if FRAME_PAGED_AMX
    if (amx_ && direct) {
      sweep(table, 0, group.keys, work.head, work.head + 1, rows, groups, group.keys, true, Mode::kFloat);
    } else if (amx_) {
      amx::Tiles tiles;
      sweep(table, 0, group.keys, work.head, work.head + 1, rows, groups, group.keys, false, Mode::kTiles);
    } else {
      sweep(table, 0, group.keys, work.head, work.head + 1, rows, groups, group.keys, direct);
    }
#else
    sweep(table, 0, group.keys, work.head, work.head + 1, rows, groups, group.keys, direct);
#endif
    for (int32_t m = 0; m < work.count; ++m)
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t r = m * groups + g;
        float* saved = cascade_.row(group.seqs[work.first + m], work.head, g);
        std::memcpy(saved, acc_.data() + r * D, D * sizeof(float));
        saved[D] = max_[r];
        saved[D + 1] = sum_[r];
      }
  }

  void operator()(const WorkItem& item) {
    const int64_t groups = p_.heads / p_.kv_heads, kv_heads = p_.kv_heads, tokens = item.num_tokens;
    const int64_t head_rows = tokens * groups, rows = kv_heads * head_rows;
    const int32_t* table = p_.block_tables + item.seq * p_.table_width;
    const int64_t q_start = p_.query_start[item.seq];
    const int64_t q_len = p_.query_start[item.seq + 1] - q_start;
    const int64_t first_pos = p_.seq_lens[item.seq] - q_len + item.first_token;  // the item's first token
    const int64_t end = first_pos + tokens;  // keys [0, end) cover every row

    // Rows ordered KV head, token, grouped head: r = (h * tokens + t) * groups + g.
    start_rows(rows);
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t t = 0; t < tokens; ++t)
        std::memcpy(queries_.data() + (h * tokens + t) * groups * D,
                    p_.query + (q_start + item.first_token + t) * p_.query_stride + h * groups * D,
                    groups * D * sizeof(uint16_t));

    int64_t k_begin = 0;
    if (q_len == 1 && cascade_.slot[item.seq] >= 0) {
      for (int64_t h = 0; h < kv_heads; ++h)
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t r = h * groups + g;
          const float* saved = cascade_.row(item.seq, h, g);
          std::memcpy(acc_.data() + r * D, saved, D * sizeof(float));
          max_[r] = saved[D];
          sum_[r] = saved[D + 1];
        }
      k_begin = cascade_.shared[item.seq];
    }
    // Prompt rows take the prefill path however few they are: the last one or two tokens of a prompt the prefix
    // cache covers then get the bits they get inside a long prefill (each row's sums are its own on that path), and
    // a request answers the same whether its prefix was cached or not. The decode path sums in another order (and
    // on AMX another unit), and GGUF's packed kernels, which round activations to int8 per block, made that last
    // bit another token. Decodes (never prompt rows; the cascade takes none) keep the decode path's speed.
    const bool direct = head_rows <= kDirectMaxRows && !p_.is_prompt(item.seq);
#if FRAME_PAGED_AMX
    // On CPUs with AMX (Intel's, where vdpbf16ps issues at half the FMA rate) decode rows take float32 FMAs and
    // tiles take the tile unit: prefill items the blocked kernel (amx_prefill.h), other tiles (a decode with more
    // than 8 grouped heads) amx_tile_rows.
    if (amx_) {
      if (direct) {
        sweep(table, k_begin, end, 0, kv_heads, head_rows, groups, first_pos, direct, Mode::kFloat);
      } else if (flash_ok_ && k_begin == 0) {  // writes the item's rows itself
        flash_(item);
        return;
      } else {
        amx::Tiles tiles;
        sweep(table, k_begin, end, 0, kv_heads, head_rows, groups, first_pos, direct, Mode::kTiles);
      }
      write_out(item, q_start, tokens, groups);
      return;
    }
#endif
    sweep(table, k_begin, end, 0, kv_heads, head_rows, groups, first_pos, direct);
    write_out(item, q_start, tokens, groups);
  }

 private:
  // Empty softmax state for `rows` rows, and room for their queries (zero-padded: the tile paths read queries
  // four, or on AMX sixteen, rows at a time).
  void start_rows(int64_t rows) {
    queries_.assign((rows + 15) * D, 0);  // the AMX path reads 16 rows at a time
    acc_.assign(rows * D, 0.0f);
    max_.assign(rows, kMasked);
    sum_.assign(rows, 0.0f);
  }

  // Attends the rows to keys [k_begin, k_end) of `table` for KV heads [h_begin, h_end) (head h's rows start
  // at (h - h_begin) * head_rows); the first row's token sits at first_pos.
  // `mode`: kVectors, vdpbf16ps (direct_rows, tile_rows); kTiles, tile rows on AMX (amx_tile_rows, in an
  // amx::Tiles scope); kFloat, direct rows on float32 FMAs (float_rows).
  enum class Mode { kVectors, kTiles, kFloat };
  void sweep(const int32_t* table, int64_t k_begin, int64_t k_end, int64_t h_begin, int64_t h_end,
             int64_t head_rows, int64_t groups, int64_t first_pos, bool direct, Mode mode = Mode::kVectors) {
    const uint16_t* keys[kKeys];
    const uint16_t* values[kKeys];
    int64_t bases[kKeys];
    int64_t ahead[kKeys];  // pool offsets of the next step's keys, prefetched head by head
    for (int64_t pos = k_begin; pos < std::min<int64_t>(k_begin + kKeys, k_end); ++pos) prefetch_key(p_, table, pos);
    for (int64_t k0 = k_begin; k0 < k_end; k0 += kKeys) {
      const int n = static_cast<int>(std::min<int64_t>(kKeys, k_end - k0));
      key_offsets(table, k0, n, bases);
      const int64_t k_ahead = k0 + kKeys;
      const int n_ahead = static_cast<int>(std::clamp<int64_t>(k_end - k_ahead, 0, kKeys));
      key_offsets(table, k_ahead, n_ahead, ahead);
      for (int64_t h = h_begin; h < h_end; ++h) {
        queue_prefetches(ahead, n_ahead, h);
        issue_prefetches(kPrefetchBurst);
        for (int j = 0; j < kKeys; ++j) {
          // Past the last key, zeros: a pool slot may hold anything, and 0 * NaN would poison the sums.
          keys[j] = j < n ? reinterpret_cast<const uint16_t*>(p_.k_cache + bases[j] + h * D) : zeros_.data();
          values[j] = j < n ? reinterpret_cast<const uint16_t*>(p_.v_cache + bases[j] + h * D) : zeros_.data();
        }
        const HeadState head{(h - h_begin) * head_rows, head_rows, groups, first_pos, k0, n};
        if (mode == Mode::kFloat) {  // V rows are read where they lie
          float_rows(head, keys, values);
          issue_prefetches(kPrefetchLines);
          continue;
        }
        interleave_values(values, mode == Mode::kTiles ? kKeys : n);  // the tiles read every pair: zeros past n
        issue_prefetches(kPrefetchBurst);
#if FRAME_PAGED_AMX
        if (mode == Mode::kTiles) {
          transpose_keys(keys);
          amx_tile_rows(head);
          issue_prefetches(kPrefetchLines);
          continue;
        }
#endif
        if (direct) {
          direct_rows(head, keys);
        } else {
          transpose_keys(keys);
          tile_rows(head);
        }
        issue_prefetches(kPrefetchLines);
      }
    }
  }

  // Pool offsets (in elements) of keys [k0, k0 + n).
  void key_offsets(const int32_t* table, int64_t k0, int n, int64_t* out) const {
    int64_t block = k0 / p_.block_size, offset = k0 % p_.block_size;
    for (int j = 0; j < n; ++j) {
      out[j] = (table[block] * p_.block_size + offset) * p_.kv_heads * D;
      if (++offset == p_.block_size) {
        offset = 0;
        ++block;
      }
    }
  }

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
    int valid(int64_t r) const { return static_cast<int>(std::min<int64_t>(n, first_pos + r / groups - k0 + 1)); }
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

  void finish_row(int64_t row, __m512 lo, __m512 hi, int valid) { finish_rows<1>(row, &lo, &hi, &valid); }

  // R adjacent rows' online-softmax updates with a step's scores (lo: keys 0-15, hi: 16-31), then acc += P.V over
  // the step's keys, for the R rows together: the V pairs (vpairs_, [kKeys / 2][D / 16] vectors of 16 pairs) are
  // loaded once for the R rows, and R x D / 16 independent accumulator chains hide vdpbf16ps' latency, where one
  // row's D / 16 chains could not. Each row's sums run in the same order whatever R. Every row must see a key.
  template <int R>
  void finish_rows(int64_t row, const __m512* lo, const __m512* hi, const int* valid) {
    if constexpr (R > 1 && R * D > 256) {  // the rows' accumulators would not fit in the registers
      for (int b = 0; b < R; ++b) finish_rows<1>(row + b, lo + b, hi + b, valid + b);
    } else {
      const __m512 scale = _mm512_set1_ps(p_.scale);
      alignas(64) uint32_t pairs[R][kKeys / 2];
      int most = 0;
      for (int b = 0; b < R; ++b) {
        float* acc = acc_.data() + (row + b) * D;
        const __m512i probs = fold32<D>(_mm512_mul_ps(lo[b], scale), _mm512_mul_ps(hi[b], scale), valid[b],
                                        max_[row + b], sum_[row + b], acc);
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
      const int valid = head.valid(r);
      if (valid <= 0) continue;
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
      finish_row(row, reduce16(dots), valid > 16 ? reduce16(dots + 16) : _mm512_setzero_ps(), valid);
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
    const __m512 scale = _mm512_set1_ps(p_.scale);
    for (int r = 0; r < R; ++r) {
      const int valid = head.valid(r);
      __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
      if (valid > 0) {
        lo = _mm512_mul_ps(reduce16(dots[r]), scale);
        hi = head.n > 16 ? _mm512_mul_ps(reduce16(dots[r] + 16), scale) : _mm512_setzero_ps();
        fold32_float<D>(lo, hi, valid, max_[head.row0 + r], sum_[head.row0 + r], acc_.data() + (head.row0 + r) * D);
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
    const __m512 scale = _mm512_set1_ps(p_.scale);
    // Rows whose token lies before the step's keys see none of them (rows are ordered by token).
    const int64_t first_seeing = std::max<int64_t>(0, (head.k0 - head.first_pos) * head.groups) / 16 * 16;
    for (int64_t rb = first_seeing; rb < head.rows; rb += 16) {
      const int64_t rows = std::min<int64_t>(16, head.rows - rb);
      amx::tile_scores<D>(queries_.data() + (head.row0 + rb) * D, keys_t_.data(), s);
      for (int64_t r = 0; r < 16; ++r) {
        const int valid = r < rows ? head.valid(rb + r) : 0;
        if (valid <= 0) {
          _mm512_store_si512(probs[r], _mm512_setzero_si512());
          continue;
        }
        const int64_t row = head.row0 + rb + r;
        const __m512i pairs = fold32<D>(_mm512_mul_ps(_mm512_load_ps(s + r * kKeys), scale),
                                        _mm512_mul_ps(_mm512_load_ps(s + r * kKeys + 16), scale), valid, max_[row],
                                        sum_[row], acc_.data() + row * D);
        _mm512_store_si512(probs[r], pairs);
      }
      amx::accumulate<D>(&probs[0][0], vpairs_.data(), rows, acc_.data() + (head.row0 + rb) * D);
      issue_prefetches(kPrefetchBurst);
    }
  }
#endif

  // Prefill tiles: four rows' 32 scores as eight chains over the transposed key pairs.
  __attribute__((noinline)) void tile_rows(const HeadState& head) {
    // Rows whose token lies before the step's keys see none of them (rows are ordered by token).
    const int64_t first_seeing = std::max<int64_t>(0, (head.k0 - head.first_pos) * head.groups) / 4 * 4;
    for (int64_t rb = first_seeing; rb < head.rows; rb += 4) {
      const auto* q = reinterpret_cast<const int32_t*>(queries_.data() + (head.row0 + rb) * D);
      __m512 lo[4], hi[4];
      for (int b = 0; b < 4; ++b) lo[b] = hi[b] = _mm512_setzero_ps();
      for (int d2 = 0; d2 < D / 2; ++d2) {
        const __m512bh k_lo = (__m512bh)_mm512_loadu_si512(keys_t_.data() + d2 * kKeys);
        const __m512bh k_hi = (__m512bh)_mm512_loadu_si512(keys_t_.data() + d2 * kKeys + 16);
        for (int b = 0; b < 4; ++b) {
          const __m512bh qb = (__m512bh)_mm512_set1_epi32(q[b * D / 2 + d2]);
          lo[b] = _mm512_dpbf16_ps(lo[b], qb, k_lo);
          hi[b] = _mm512_dpbf16_ps(hi[b], qb, k_hi);
        }
      }
      int valid[4];
      bool all_see = rb + 4 <= head.rows;
      for (int b = 0; b < 4; ++b) {
        valid[b] = rb + b < head.rows ? head.valid(rb + b) : 0;
        all_see = all_see && valid[b] > 0;
      }
      if (all_see) {
        finish_rows<4>(head.row0 + rb, lo, hi, valid);
      } else {
        for (int b = 0; b < 4; ++b)
          if (valid[b] > 0) finish_row(head.row0 + rb + b, lo[b], hi[b], valid[b]);
      }
      issue_prefetches(kPrefetchBurst);
    }
  }

  void write_out(const WorkItem& item, int64_t q_start, int64_t tokens, int64_t groups) {
    for (int64_t h = 0; h < p_.kv_heads; ++h)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t row = (h * tokens + t) * groups + g;
          bf16* dst = p_.out + ((q_start + item.first_token + t) * p_.heads + h * groups + g) * D;
          write_row(acc_.data() + row * D, 1.0f / sum_[row], dst);
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
  Cascade<D>& cascade_;
  std::vector<uint16_t> zeros_, queries_;
  std::vector<uint32_t> vpairs_;  // the step's V, key pairs interleaved: [kKeys / 2][D / 16] vectors of 16 pairs
  std::vector<uint32_t> keys_t_;  // the step's K as [D / 2][kKeys] bfloat16 pairs (prefill tiles)
  std::vector<float> acc_, max_, sum_;
  bool amx_ = false;
#if FRAME_PAGED_AMX
  amx::FlashPrefill<D> flash_;
  bool flash_ok_ = false;
#endif
  const char* lines_[kPrefetchLines];
  int queued_ = 0, issued_ = 0;
};

}  // namespace frame_cpu_paged
#endif
