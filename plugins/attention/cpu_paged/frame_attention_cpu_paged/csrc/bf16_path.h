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
//
// This file holds the per-thread item runner (the block-table walk, cascade prefixes, which kernel takes an item);
// the row kernels are in bf16_rows.h, the vector pieces in bf16_vectors.h, cascade planning in cascade.h.
#pragma once

#include "amx_prefill.h"
#include "amx_tiles.h"
#include "bf16_rows.h"
#include "cascade.h"
#include "common.h"

#include <vector>

#if defined(__AVX512BF16__)
namespace frame_cpu_paged {

// Runs the items of one call on one thread, keeping its scratch between items.
template <int D>
class Bf16ItemRunner : public Bf16Rows<D> {
 public:
  using bf16 = c10::BFloat16;

  Bf16ItemRunner(const Problem<bf16, bf16>& p, Cascade<D>& cascade)
      : Bf16Rows<D>(p), cascade_(cascade), zeros_(D, 0)
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
    // With a sliding window no row sees a key before the first row's window.
    if (p_.window > 0) k_begin = std::max<int64_t>(k_begin, window_sweep_start(first_pos, p_.window));
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
  using Base = Bf16Rows<D>;
  using typename Base::HeadState;
  using Base::p_, Base::queries_, Base::acc_, Base::max_, Base::sum_;
  using Base::kPrefetchBurst, Base::kPrefetchLines, Base::queue_prefetches, Base::issue_prefetches;
  using Base::interleave_values, Base::transpose_keys, Base::direct_rows, Base::tile_rows, Base::float_rows;
  using Base::write_row;
#if FRAME_PAGED_AMX
  using Base::amx_tile_rows;
#endif

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
        const HeadState head{(h - h_begin) * head_rows, head_rows, groups, first_pos, k0, n, p_.window};
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

  void write_out(const WorkItem& item, int64_t q_start, int64_t tokens, int64_t groups) {
    for (int64_t h = 0; h < p_.kv_heads; ++h)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t row = (h * tokens + t) * groups + g;
          bf16* dst = p_.out + ((q_start + item.first_token + t) * p_.heads + h * groups + g) * D;
          write_row(acc_.data() + row * D, 1.0f / sum_[row], dst);
        }
  }

  Cascade<D>& cascade_;
  std::vector<uint16_t> zeros_;
  bool amx_ = false;
#if FRAME_PAGED_AMX
  amx::FlashPrefill<D> flash_;
  bool flash_ok_ = false;
#endif
};

}  // namespace frame_cpu_paged
#endif
