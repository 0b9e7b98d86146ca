// How a call's work is cut and handed out: items of (sequence, tile of query tokens) planned so the expensive
// prefill tiles go first, and a dynamic hand-out of items to torch's intra-op threads. Both paths use them.
#pragma once

#include "common.h"

#include <algorithm>
#include <atomic>
#include <vector>

namespace frame_cpu_paged {

constexpr int kTargetRows = 192;    // query rows (tokens x grouped heads) a prefill tile aims for
constexpr int kFlashTokens = 512;   // most tokens of a long prompt's prefill tile on the AMX flash kernel

// Items of (sequence, tile of query tokens). A tile holds about kTargetRows rows; with `most` above that, a long
// prompt's tiles grow toward `most` tokens while the prompt still gives each thread four of them: every tile reads
// all its keys once per KV head, so at 8,000 tokens tiles of 64 read the KV 125 times over, more than the AMX
// flash kernel's cores could take from memory (its 4,096-token chunk after 3,904 ran 1.6x faster in 512-token tiles).
inline std::vector<WorkItem> plan_items(const int32_t* query_start, int64_t num_seqs, int64_t groups,
                                        int64_t most = 0) {
  const int64_t base = std::max<int64_t>(1, kTargetRows / groups);
  const int64_t pieces = 4 * std::max(1, at::get_num_threads());
  std::vector<WorkItem> prefill, decode;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = query_start[s + 1] - query_start[s];
    const int64_t tile = std::clamp(((q_len + pieces - 1) / pieces + 15) & ~int64_t{15}, base, std::max(base, most));
    auto& list = q_len > 1 ? prefill : decode;
    for (int64_t t0 = 0; t0 < q_len; t0 += tile)
      list.push_back({static_cast<int32_t>(s), static_cast<int32_t>(t0), static_cast<int32_t>(std::min(tile, q_len - t0))});
  }
  // Later tiles of a sequence see more keys: hand out the longest first.
  std::stable_sort(prefill.begin(), prefill.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.first_token > b.first_token; });
  prefill.insert(prefill.end(), decode.begin(), decode.end());
  return prefill;
}

// Hands items to torch's intra-op threads dynamically; each thread builds its scratch once with make_worker()
// and runs worker(item) for every item it takes.
template <typename Item, typename MakeWorker>
void run_items(const std::vector<Item>& items, MakeWorker make_worker) {
  std::atomic<int64_t> next{0};
  const int64_t total = static_cast<int64_t>(items.size());
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), total));
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t thread = begin; thread < end; ++thread) {
      auto worker = make_worker();
      for (int64_t i = next.fetch_add(1); i < total; i = next.fetch_add(1)) worker(items[i]);
    }
  });
}

}  // namespace frame_cpu_paged
