// Cascade attention of the bfloat16 path: which decode sequences share leading blocks (or which lone long decode
// is split over the threads), and the saved softmax state each such sequence's own item resumes from.
#pragma once

#include "bf16_vectors.h"
#include "common.h"

#include <algorithm>
#include <utility>
#include <vector>

#if defined(__AVX512BF16__)
namespace frame_cpu_paged {

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
  // Per slot, KV head and grouped head: D accumulators, max, sum. The pieces that save a state and the item that
  // resumes from it may run on different threads, so a team's call keeps it in the team's scratch (place_state).
  float* state = nullptr;
  size_t state_floats = 0;
  std::vector<float> own_state;  // where it lies when the call runs on torch's threads
  int64_t kv_heads, groups_per_kv;

  static constexpr int64_t kRowFloats = D + 2;

  // `threads`: with fewer sequences than threads, a long decode becomes a group of its own, so its keys before
  // the last step are swept one KV head per thread (prefix) instead of all heads on one (a single stream).
  Cascade(const Problem<c10::BFloat16, c10::BFloat16>& p, int64_t num_seqs, int64_t threads)
      : slot(num_seqs, -1), shared(num_seqs, 0), kv_heads(p.kv_heads), groups_per_kv(p.heads / p.kv_heads) {
    std::vector<std::pair<int32_t, int32_t>> decodes;  // (first block, sequence)
    for (int64_t s = 0; s < num_seqs; ++s)
      // A windowed layer's decodes see only their window's keys: no shared prefix, no long sweep to split.
      if (p.query_start[s + 1] - p.query_start[s] == 1 && p.seq_lens[s] - 1 >= kMinKeys && !p.is_prompt(s) &&
          p.window == 0)
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
    state_floats = static_cast<size_t>(next_slot) * kv_heads * groups_per_kv * kRowFloats;
  }

  // Keeps the saved states in `shared` (state_floats of them, from a team's scratch), or in own_state when null.
  void place_state(float* shared) {
    if (shared == nullptr) {
      own_state.assign(state_floats, 0.0f);
      shared = own_state.data();
    }
    state = shared;
  }

  // The saved state of grouped head g of KV head h of sequence seq (which must be in a group).
  float* row(int32_t seq, int64_t h, int64_t g) {
    return state + ((slot[seq] * kv_heads + h) * groups_per_kv + g) * kRowFloats;
  }
};

}  // namespace frame_cpu_paged
#endif
