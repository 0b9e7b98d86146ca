// How a call's work is cut and handed out: items of (sequence, tile of query tokens) planned so the expensive
// prefill tiles go first, and a dynamic hand-out of items to a crew: torch's intra-op threads, or the threads of a
// team already running (the op's team form). Both paths use them.
#pragma once

#include "common.h"

#include <frame/team_form.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace frame_cpu_paged {

// The threads that run one call's work: torch's intra-op threads, for the op called on its own (Crew()), or the
// threads of a team already running a parallel region, every one of them inside this call (the op's team form,
// <frame/team_form.h>: a cpu platform's step program). Each run_items of the call takes the next of the call's
// hand-out counters; the threads of a team take them in the same order, so they share each one.
class Crew {
 public:
  Crew() = default;
  explicit Crew(const frame::Team& team) : team_(&team) {}
  Crew(const Crew&) = delete;  // its counters may be its own
  Crew& operator=(const Crew&) = delete;

  bool in_team() const { return team_ != nullptr; }
  int thread() const { return team_ != nullptr ? team_->thread : 0; }
  int64_t threads() const { return team_ != nullptr ? team_->threads : std::max(1, at::get_num_threads()); }

  // Once per call, on every thread, before the first counter: in a team, the team's scratch (a sync) holding the
  // counters and `extra` zeroed bytes, which are returned; on torch's threads, nullptr (the call keeps its own).
  void* begin(size_t extra) {
    if (team_ == nullptr) return nullptr;
    auto* scratch = static_cast<char*>(team_->scratch(kCounters * kLine + extra));
    counters_ = scratch;
    return extra > 0 ? scratch + kCounters * kLine : nullptr;
  }

  // The call's next counter, zero at first (each on its own cache line: the threads bump them at once).
  int64_t* counter() {
    TORCH_CHECK(next_ < kCounters, "an attention call took more hand-out counters than its crew holds");
    return reinterpret_cast<int64_t*>(counters_ + kLine * next_++);
  }

  // Waits for the rest of a team (the work handed out before is done); on torch's threads run_items has joined.
  void sync() const {
    if (team_ != nullptr) team_->sync();
  }

 private:
  static constexpr int kCounters = 4, kLine = 64;
  const frame::Team* team_ = nullptr;
  alignas(64) char own_[kCounters * kLine] = {};
  char* counters_ = own_;
  int next_ = 0;
};

// Adds one to a counter the crew's threads share and returns what it held (acq_rel: what a thread did before its
// increment is seen by the thread that reads the count after it).
inline int64_t take(int64_t* counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_ACQ_REL); }

constexpr int kTargetRows = 192;    // query rows (tokens x grouped heads) a prefill tile aims for
constexpr int kFlashTokens = 512;   // most tokens of a long prompt's prefill tile on the AMX flash kernel
// The same on the bfloat16 vector path, whose tiles transpose and interleave each 32-key step's K and V once for
// all their rows: at 8,000 tokens, tiles of 256 ran a layer's attention about 5% faster than tiles of 64 (Zen 5).
constexpr int kVectorTokens = 256;

// Items of (sequence, tile of query tokens). A tile holds about kTargetRows rows; with `most` above that, a long
// prompt's tiles grow toward `most` tokens while the prompt still gives each thread four of them: every tile reads
// all its keys once per KV head, so at 8,000 tokens tiles of 64 read the KV 125 times over, more than the AMX
// flash kernel's cores could take from memory (its 4,096-token chunk after 3,904 ran 1.6x faster in 512-token tiles).
inline std::vector<WorkItem> plan_items(const int32_t* query_start, int64_t num_seqs, int64_t groups,
                                        int64_t threads, int64_t most = 0) {
  const int64_t base = std::max<int64_t>(1, kTargetRows / groups);
  const int64_t pieces = 4 * std::max<int64_t>(1, threads);
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

// Hands items to the crew's threads dynamically; each thread that takes one builds its scratch once with
// make_worker() and runs worker(item) for every item it takes.
template <typename Item, typename MakeWorker>
void run_items(const std::vector<Item>& items, MakeWorker make_worker, Crew& crew) {
  int64_t* next = crew.counter();
  const int64_t total = static_cast<int64_t>(items.size());
  auto drain = [&] {
    std::optional<decltype(make_worker())> worker;
    for (int64_t i = take(next); i < total; i = take(next)) {
      if (!worker) worker.emplace(make_worker());
      (*worker)(items[i]);
    }
  };
  if (crew.in_team()) return drain();
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(crew.threads(), total));
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t thread = begin; thread < end; ++thread) drain();
  });
}

}  // namespace frame_cpu_paged
