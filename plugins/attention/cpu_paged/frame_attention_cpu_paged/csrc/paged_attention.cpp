// Paged causal attention for CPUs: one call per layer serves a whole mixed batch (prefills, prefill chunks,
// decodes), reading K/V straight from the block pool through each sequence's block table.
//
// Work is split into items of (sequence, tile of query tokens) covering every head, so each block of the pool
// is read front to back once per item (the next keys are prefetched while this one computes); the query heads
// that share a KV head are processed together. Every item runs an online softmax over its keys in float32.
// Items are handed to torch's intra-op threads dynamically, the expensive prefill tiles first.
//
// Two implementations:
// - bf16_path.h, for a bfloat16 cache and queries on CPUs with AVX-512 BF16 (head_dim a multiple of 32): both
//   products on vdpbf16ps, or on AMX tiles where the CPU has them (amx_tiles.h; prefill items amx_prefill.h, a
//   blocked flash-style kernel with the scores transposed), 32-key softmax steps, and
//   cascade attention over prefix blocks that decodes share.
// - The float path (float_item.h, float_chunk.h), for everything else (float32, float16, other head sizes, other CPUs), 16 keys a step. Few query
//   rows (decodes) take dot products along head_dim, one K row at a time; many rows (prefill tiles) first
//   transpose a 16-key chunk to float32 so each row's 16 scores are one vector FMA chain. Both have AVX-512
//   versions (head_dim a multiple of 16, float_chunk.h) and AVX2 ones (head_dim a multiple of 8, avx2_path.h) beside
//   generic loops the compiler vectorises (other head sizes, windows, soft-caps, other ISAs).
//
// This file holds the ops (argument checks, dtype and head_dim dispatch, the quantized pool's prefill through the
// bfloat16 path, registration). The float path's pieces: float_item.h (an item), float_chunk.h (a chunk),
// work_items.h (planning and hand-out), kv_write.h (storing new K/V), convert.h (element conversions).

#include "bf16_path.h"
#include "common.h"
#include "convert.h"
#include "float_item.h"
#include "kv_write.h"
#include "work_items.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

using namespace frame_cpu_paged;

#if defined(__AVX512BF16__)
// A single stream's decode whose keys the cascade split over the threads (one piece per KV head): the pieces and
// then the item that resumes from them, in one parallel region (torch's, or the team's that runs the op's team
// form). Whoever finishes the last piece runs the item, where
// two regions made the other thread wait through the item at a second barrier (and libgomp pays a futex wake per
// barrier): 30 fewer regions a SmolLM2 token. The same work in the same order, so the same bits.
template <int D>
bool lone_decode_at_once(const Problem<c10::BFloat16, c10::BFloat16>& p, const std::vector<WorkItem>& items,
                         Cascade<D>& cascade, Crew& crew) {
  if (p.num_seqs != 1 || items.size() != 1 || cascade.work.empty() || cascade.slot[items[0].seq] < 0) return false;
#if FRAME_PAGED_AMX
  if (amx::permitted() && amx::FlashPrefill<D>::serves(p)) return false;
#endif
  const int64_t total = static_cast<int64_t>(cascade.work.size());
  int64_t* done = crew.counter();
  run_items(cascade.work, [&] {
    return [&, runner = Bf16ItemRunner<D>(p, cascade)](const PrefixWork& work) mutable {
      runner.prefix(work);
      // acq_rel: the last finisher sees every piece's saved state before resuming from it.
      if (take(done) + 1 == total) runner(items[0]);
    };
  }, crew);
  return true;
}
#endif

template <typename cache_t, typename query_t, int D>
void run_all(const Problem<cache_t, query_t>& p, const std::vector<WorkItem>& items, Crew& crew) {
#if defined(__AVX512BF16__)
  // The bfloat16 path serves every bfloat16 problem of its head sizes: it masks a sliding window and applies a
  // soft-cap itself.
  if constexpr (std::is_same_v<cache_t, c10::BFloat16> && std::is_same_v<query_t, c10::BFloat16> && D > 0 &&
                D % 32 == 0) {
    Cascade<D> cascade(p, p.num_seqs, crew.threads());
    cascade.place_state(static_cast<float*>(crew.begin(cascade.state_floats * sizeof(float))));
    if (lone_decode_at_once<D>(p, items, cascade, crew)) return;
    if (!cascade.work.empty()) {
      run_items(cascade.work, [&] {
        return [runner = Bf16ItemRunner<D>(p, cascade)](const PrefixWork& work) mutable { runner.prefix(work); };
      }, crew);
      crew.sync();  // every saved state before an item resumes from it
    }
#if FRAME_PAGED_AMX
    if (amx::permitted() && amx::FlashPrefill<D>::serves(p)) {
      run_items(plan_items(p.query_start, p.num_seqs, p.heads / p.kv_heads, crew.threads(), kFlashTokens),
                [&] { return Bf16ItemRunner<D>(p, cascade); }, crew);
      return;
    }
#endif
    // The vector path's long prompts in larger tiles (kVectorTokens); AMX's tiles, where the flash kernel does not
    // serve (a window, a soft-cap), keep the items they were measured with.
    bool vector_tiles = true;
#if FRAME_PAGED_AMX
    vector_tiles = !amx::permitted();
#endif
    run_items(vector_tiles ? plan_items(p.query_start, p.num_seqs, p.heads / p.kv_heads, crew.threads(), kVectorTokens)
                           : items,
              [&] { return Bf16ItemRunner<D>(p, cascade); }, crew);
    return;
  }
#endif
  crew.begin(0);
  run_items(items, [&] {
    return [&p, st = Accumulator(), kbuf = std::vector<float>(p.kv_heads * kChunk * p.head_dim),
            vbuf = std::vector<float>(p.kv_heads * kChunk * p.head_dim)](const WorkItem& item) mutable {
      run_item<cache_t, query_t, D>(p, item, st, kbuf, vbuf);
    };
  }, crew);
}

template <typename cache_t, typename query_t>
void dispatch_dim(const Problem<cache_t, query_t>& p, const std::vector<WorkItem>& items, Crew& crew) {
  switch (p.head_dim) {
    case 64: return run_all<cache_t, query_t, 64>(p, items, crew);
    case 128: return run_all<cache_t, query_t, 128>(p, items, crew);
    case 256: return run_all<cache_t, query_t, 256>(p, items, crew);  // Gemma 2 and 3
    default: return run_all<cache_t, query_t, 0>(p, items, crew);
  }
}

void attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
               double scale, int64_t window, double softcap, const std::optional<at::Tensor>& prompt);

#if defined(__AVX512BF16__)
// Per sequence, the first block a sweep over its keys reads: the 32-key step holding its first query's first key (0
// without a window).
std::vector<int64_t> first_blocks(const int32_t* qs, const int32_t* sl, int64_t seqs, int64_t block_size,
                                  int64_t window) {
  std::vector<int64_t> first_block(seqs, 0);
  if (window > 0)
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t first_pos = sl[s] - (qs[s + 1] - qs[s]);
      first_block[s] = window_sweep_start(first_pos, window) / block_size;
    }
  return first_block;
}

// Whether a step reads each key it reads by at least 32 queries on average (query x key pairs against keys).
bool worth_widening(const std::vector<int64_t>& first_block, int64_t block_size, const int32_t* qs,
                    const int32_t* sl) {
  int64_t work = 0, context = 0;
  for (size_t s = 0; s < first_block.size(); ++s) {
    const int64_t keys = sl[s] - first_block[s] * block_size;
    work += static_cast<int64_t>(qs[s + 1] - qs[s]) * keys;
    context += keys;
  }
  constexpr int64_t kMinReuse = 32;
  return work >= kMinReuse * context;
}
#endif

// A step whose attention costs far more than reading its context once (a prefill: every key is read by every
// query tile) over a quantized pool, with bfloat16 queries on a CPU with AVX-512 BF16: the blocks the step reads are
// dequantized once into a bfloat16 scratch pool and attended by the bfloat16 path (AMX tiles where the CPU has
// them), instead of being widened chunk by chunk on the float path for every tile. Decodes (each key read once)
// stay on the float path, which reads the codes in place. With a sliding window only the blocks from each sequence's
// first window on are widened (the bfloat16 path's sweep starts there). True when the step qualifies.
bool widens(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& starts, const at::Tensor& lens,
            int64_t window) {
#if defined(__AVX512BF16__)
  if (query.scalar_type() != at::kBFloat16 || (k_cache.size(3) - kScaleBytes) % 32 != 0) return false;
  const int32_t* qs = starts.data_ptr<int32_t>();
  const int32_t* sl = lens.data_ptr<int32_t>();
  return worth_widening(first_blocks(qs, sl, lens.numel(), k_cache.size(1), window), k_cache.size(1), qs, sl);
#else
  return false;
#endif
}

// Attends a step that widens (above) through a bfloat16 scratch pool.
void attend_through_bfloat16(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& tables, const at::Tensor& starts,
                             const at::Tensor& lens, double scale, int64_t window, double softcap,
                             const std::optional<at::Tensor>& prompt) {
#if defined(__AVX512BF16__)
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2), row = k_cache.size(3);
  const int64_t dim = row - kScaleBytes, seqs = lens.numel(), width = tables.size(1);
  const int32_t* sl = lens.data_ptr<int32_t>();
  const int32_t* qs = starts.data_ptr<int32_t>();
  const int32_t* tp = tables.data_ptr<int32_t>();
  const std::vector<int64_t> first_block = first_blocks(qs, sl, seqs, block_size, window);
  std::vector<int32_t> used;
  for (int64_t s = 0; s < seqs; ++s)
    used.insert(used.end(), tp + s * width + first_block[s],
                tp + s * width + (sl[s] + block_size - 1) / block_size);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  const auto n = static_cast<int64_t>(used.size());
  const auto opts = k_cache.options().dtype(at::kBFloat16);
  at::Tensor k = at::empty({n, block_size, kv_heads, dim}, opts);
  at::Tensor v = at::empty({n, block_size, kv_heads, dim}, opts);
  at::Tensor remapped = at::empty(tables.sizes(), tables.options());
  int32_t* rp = remapped.data_ptr<int32_t>();
  std::fill(rp, rp + remapped.numel(), 0);
  for (int64_t s = 0; s < seqs; ++s)  // blocks before first_block stay 0: the sweep never reads them
    for (int64_t b = first_block[s]; b < (sl[s] + block_size - 1) / block_size; ++b)
      rp[s * width + b] = static_cast<int32_t>(std::lower_bound(used.begin(), used.end(), tp[s * width + b]) - used.begin());
  auto widen = [&](auto* codes) {
    using code_t = std::remove_pointer_t<decltype(codes)>;
    const code_t* kc = reinterpret_cast<const code_t*>(k_cache.data_ptr());
    const code_t* vc = reinterpret_cast<const code_t*>(v_cache.data_ptr());
    auto* kd = k.data_ptr<c10::BFloat16>();
    auto* vd = v.data_ptr<c10::BFloat16>();
    const int64_t rows_per_block = block_size * kv_heads;
    at::parallel_for(0, n * rows_per_block, 64, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t src = used[r / rows_per_block] * rows_per_block + r % rows_per_block;
        for (int kv = 0; kv < 2; ++kv) {
          const code_t* from = (kv ? vc : kc) + src * row;
          c10::BFloat16* to = (kv ? vd : kd) + r * dim;
          const float sc = row_scale(from, dim);
          for (int64_t d = 0; d < dim; ++d) to[d] = c10::BFloat16(to_float(from[d]) * sc);
        }
      }
    });
  };
  if (k_cache.scalar_type() == at::kChar)
    widen(static_cast<int8_t*>(nullptr));
  else
    widen(static_cast<c10::Float8_e4m3fn*>(nullptr));
  attention(out, query, k, v, remapped, starts, lens, scale, window, softcap, prompt);
#endif
}

// `prompt` (bool [seqs], optional): the sequences whose new tokens are prompt tokens, which the bfloat16 path gives
// its prefill kernel however few they are (bf16_path.h, Bf16ItemRunner). Every check comes before the crew's first
// sync, so that a team's threads raise alike.
void attend(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& block_tables, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
            double scale, int64_t window, double softcap, const std::optional<at::Tensor>& prompt, Crew& crew) {
  TORCH_CHECK(window >= 0 && softcap >= 0.0, "window and softcap must not be negative (0: none)");
  TORCH_CHECK(!prompt.has_value() || (prompt->scalar_type() == at::kBool && prompt->numel() == seq_lens.numel()),
              "prompt must be one bool per sequence");
  const at::Tensor prompts = prompt.has_value() ? prompt->contiguous() : at::Tensor();
  TORCH_CHECK(query.scalar_type() == out.scalar_type(), "query and out must share a dtype");
  TORCH_CHECK(rows_contiguous(query) && out.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "out and the caches must be contiguous, and each query token's heads");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "caches must be [blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "K and V caches must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && query_start_loc.scalar_type() == at::kInt &&
                  seq_lens.scalar_type() == at::kInt, "block tables, query starts and sequence lengths must be int32");
  const at::Tensor tables = block_tables.contiguous();
  const at::Tensor starts = query_start_loc.contiguous();
  const at::Tensor lens = seq_lens.contiguous();
  const int64_t kv_heads = k_cache.size(2), row = k_cache.size(3), heads = query.size(1);
  const int64_t head_dim = is_quantized(k_cache) ? row - kScaleBytes : row;
  if (is_quantized(k_cache) && widens(query, k_cache, starts, lens, window)) {
    // A prefill, never a recorded decode step: a team's first thread runs it whole (its at::parallel_for then runs
    // on that thread alone).
    if (crew.thread() == 0)
      attend_through_bfloat16(out, query, k_cache, v_cache, tables, starts, lens, scale, window, softcap, prompt);
    return;
  }
  TORCH_CHECK(query.size(2) == head_dim && heads % kv_heads == 0, "query heads must group over the KV heads");
  const auto items = plan_items(starts.data_ptr<int32_t>(), lens.numel(), heads / kv_heads, crew.threads());
  auto run = [&](auto* k, auto* v, auto* q, auto* o) {
    using cache_t = std::remove_const_t<std::remove_pointer_t<decltype(k)>>;
    using query_t = std::remove_const_t<std::remove_pointer_t<decltype(q)>>;
    Problem<cache_t, query_t> p{q, o, k, v, tables.data_ptr<int32_t>(), starts.data_ptr<int32_t>(),
                                lens.data_ptr<int32_t>(), tables.size(1), k_cache.size(1), heads, kv_heads,
                                head_dim, static_cast<float>(scale), query.stride(0), lens.numel(), window,
                                static_cast<float>(softcap), row,
                                prompts.defined() ? prompts.data_ptr<bool>() : nullptr};
    dispatch_dim<cache_t, query_t>(p, items, crew);
  };
  auto with_query = [&](auto* k, auto* v) {
    switch (query.scalar_type()) {
      case at::kFloat: return run(k, v, query.data_ptr<float>(), out.data_ptr<float>());
      case at::kBFloat16: return run(k, v, query.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>());
      case at::kHalf: return run(k, v, query.data_ptr<c10::Half>(), out.data_ptr<c10::Half>());
      default: TORCH_CHECK(false, "unsupported query dtype ", query.scalar_type());
    }
  };
  switch (k_cache.scalar_type()) {
    case at::kFloat: return with_query(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
    case at::kBFloat16: return with_query(k_cache.data_ptr<c10::BFloat16>(), v_cache.data_ptr<c10::BFloat16>());
    case at::kHalf: return with_query(k_cache.data_ptr<c10::Half>(), v_cache.data_ptr<c10::Half>());
    case at::kChar: return with_query(k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>());
    case at::kFloat8_e4m3fn:
      return with_query(k_cache.data_ptr<c10::Float8_e4m3fn>(), v_cache.data_ptr<c10::Float8_e4m3fn>());
    default: TORCH_CHECK(false, "unsupported KV cache dtype ", k_cache.scalar_type());
  }
}

// The `attention` op, on torch's intra-op threads.
void attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
               double scale, int64_t window, double softcap, const std::optional<at::Tensor>& prompt) {
  Crew crew;
  attend(out, query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, window, softcap, prompt, crew);
}

// What a layer calls: store the step's new K/V, then attend (one dispatch instead of several per layer).
void forward(at::Tensor& out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
             at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
             const at::Tensor& query_start_loc, const at::Tensor& seq_lens, double scale, int64_t window,
             double softcap, const std::optional<at::Tensor>& prompt) {
  write_kv(key, value, k_cache, v_cache, slot_mapping);
  attention(out, query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, window, softcap, prompt);
}

// forward's team form (<frame/team_form.h>): a cpu platform's step program calls it on every thread of the parallel
// region a decode layer runs in, instead of leaving the region for the op (which would open its own). Every thread
// checks the arguments; the first stores the new K/V, which the crew's first sync (Crew::begin) then shows the others;
// the team shares the attention's pieces and items.
void forward_team(const c10::IValue* const* args, const frame::Team& team) {
  auto& out = const_cast<at::Tensor&>(args[0]->toTensor());
  auto& k_cache = const_cast<at::Tensor&>(args[4]->toTensor());
  auto& v_cache = const_cast<at::Tensor&>(args[5]->toTensor());
  const at::Tensor& key = args[2]->toTensor();
  const at::Tensor& value = args[3]->toTensor();
  const at::Tensor& slot_mapping = args[6]->toTensor();
  check_kv_write(key, value, k_cache, v_cache, slot_mapping);
  if (team.thread == 0) store_kv(key, value, k_cache, v_cache, slot_mapping);
  Crew crew(team);
  attend(out, args[1]->toTensor(), k_cache, v_cache, args[7]->toTensor(), args[8]->toTensor(), args[9]->toTensor(),
         args[10]->toDouble(), args[11]->toInt(), args[12]->toDouble(), args[13]->toOptional<at::Tensor>(), crew);
}

}  // namespace

TORCH_LIBRARY(frame_cpu_paged, m) {
  m.def("attention(Tensor(a!) out, Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor query_start_loc, Tensor seq_lens, float scale, int window, float softcap, Tensor? prompt=None) -> ()");
  m.def("forward(Tensor(a!) out, Tensor query, Tensor key, Tensor value, Tensor(b!) k_cache, Tensor(c!) v_cache, "
        "Tensor slot_mapping, Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, float scale, int window, "
        "float softcap, Tensor? prompt=None) -> ()");
  m.def("write(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
  FRAME_TEAM_FORM(m, "forward", forward_team);
}

TORCH_LIBRARY_IMPL(frame_cpu_paged, CPU, m) {
  m.impl("attention", &attention);
  m.impl("forward", &forward);
  m.impl("write", &write_kv);
}
