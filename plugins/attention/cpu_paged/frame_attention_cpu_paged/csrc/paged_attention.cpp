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
// - This file, for everything else (float32, float16, other head sizes, other CPUs), 16 keys a step. Few query
//   rows (decodes) take dot products along head_dim, one K row at a time; many rows (prefill tiles) first
//   transpose a 16-key chunk to float32 so each row's 16 scores are one vector FMA chain. Both have AVX-512
//   versions (head_dim a multiple of 16, below) and AVX2 ones (head_dim a multiple of 8, avx2_path.h) beside
//   generic loops the compiler vectorises (other head sizes, windows, soft-caps, other ISAs).

#include "common.h"
#include "avx2_path.h"
#include "bf16_path.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

using namespace frame_cpu_paged;

constexpr int kTargetRows = 192;    // query rows (tokens x grouped heads) a prefill tile aims for
constexpr int kFlashTokens = 512;   // most tokens of a long prompt's prefill tile on the AMX flash kernel
constexpr int kPrefetchAhead = 24;  // keys: about one chunk of compute ahead of the loads

inline float to_float(float x) { return x; }
template <typename T>
inline T from_float(float x) { return static_cast<T>(x); }  // c10::BFloat16 / c10::Half round to nearest even
inline float to_float(c10::Half x) { return static_cast<float>(x); }
inline float to_float(int8_t x) { return static_cast<float>(x); }
inline float to_float(c10::Float8_e4m3fn x) { return fp8_e4m3_to_float(x.x); }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#if defined(__AVX512F__)
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

// A row's score against a key is the same float whichever path computes it, so a token's attention does not depend
// on how many rows its step brought (a decode, a one-token prefix-cache miss or a prefill tile): with weights
// whose activations are rounded to int8 per block (GGUF's packed kernels), a last-bit difference flips roundings
// and, on SmolLM2 Q4_1, changed greedy answers between identical requests. Both paths sum the D products as 16
// lanes (lane l: products l, l + 16, ..., in that order) and then the lanes pairwise: l with l + 8, then l + 4,
// l + 2, l + 1. The direct path holds the lanes of one key in a vector (lane_tree_sum); the tile path holds one
// lane of 16 keys in a vector (lane_tree), one addition more per lane than a plain chain over D.
inline float lane_tree_sum(__m512 a) {
  const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  const __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// Four rows' (q, [4][D]) lane L of 16 keys (kt, K transposed [D][kChunk]).
template <int D, int L>
inline void lane_chain(const float* q, const float* kt, __m512* out) {
  const __m512 k0 = _mm512_loadu_ps(kt + L * kChunk);
  for (int b = 0; b < 4; ++b) out[b] = _mm512_mul_ps(_mm512_set1_ps(q[b * D + L]), k0);
  for (int v = 1; v < D / 16; ++v) {
    const __m512 k = _mm512_loadu_ps(kt + (16 * v + L) * kChunk);
    for (int b = 0; b < 4; ++b) out[b] = _mm512_fmadd_ps(_mm512_set1_ps(q[b * D + 16 * v + L]), k, out[b]);
  }
}

// The sum of lanes L, L + Step, L + 2 Step, ... (below 16) as lane_tree_sum pairs them: lane_tree<D, 0, 1> is
// four rows' scores of 16 keys.
template <int D, int L, int Step>
inline void lane_tree(const float* q, const float* kt, __m512* out) {
  __m512 x[4], y[4];
  if constexpr (Step == 8) {
    lane_chain<D, L>(q, kt, x);
    lane_chain<D, L + 8>(q, kt, y);
  } else {
    lane_tree<D, L, Step * 2>(q, kt, x);
    lane_tree<D, L + Step, Step * 2>(q, kt, y);
  }
  for (int b = 0; b < 4; ++b) out[b] = _mm512_add_ps(x[b], y[b]);
}

// acc (one row, D floats) += sum_j probs[j] * V[j] over the chunk's `valid` V rows (float, [kChunk][D]).
template <int D>
inline void accumulate_values(const float* probs, int valid, const float* vrows, float* acc) {
  __m512 sums[D / 16];
  for (int v = 0; v < D / 16; ++v) sums[v] = _mm512_loadu_ps(acc + 16 * v);
  for (int j = 0; j < valid; ++j) {
    const __m512 p = _mm512_set1_ps(probs[j]);
    for (int v = 0; v < D / 16; ++v) sums[v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vrows + j * D + 16 * v), sums[v]);
  }
  for (int v = 0; v < D / 16; ++v) _mm512_storeu_ps(acc + 16 * v, sums[v]);
}
#endif

// Per-item state. Rows are ordered KV head, then token, then the query heads of that KV head
// (r = (h * tokens + t) * groups + g), so each KV head's rows are contiguous; per row the running max, sum and
// output accumulator.
struct Accumulator {
  std::vector<float> q, acc, max, sum;
  void reset(int64_t rows, int64_t dim) {
    q.assign((rows + 3) * dim, 0.0f);  // padded: the tile path multiplies rows four at a time
    acc.assign(rows * dim, 0.0f);
    max.assign(rows, kMasked);
    sum.assign(rows, 0.0f);
  }
};

// Fold one chunk's scores s[0..kChunk) (real keys in [first, valid)) of a row into the running softmax; vrows
// are the chunk's V rows as float (kChunk x D).
template <int D>
inline void fold_scores(float* s, int first, int valid, float& row_max, float& row_sum, float* acc,
                        const float* vrows, int64_t dim) {
  const int64_t d_len = D > 0 ? D : dim;
  float chunk_max = kMasked;
  for (int j = 0; j < kChunk; ++j) {
    s[j] = j >= first && j < valid ? s[j] : kMasked;
    chunk_max = std::max(chunk_max, s[j]);
  }
  const float new_max = std::max(row_max, chunk_max);
  const float correction = exp_nonpositive(row_max - new_max);
  float p_sum = 0.0f;
  for (int j = 0; j < kChunk; ++j) {
    s[j] = j >= first && j < valid ? exp_nonpositive(s[j] - new_max) : 0.0f;
    p_sum += s[j];
  }
  row_sum = row_sum * correction + p_sum;
  row_max = new_max;
  for (int64_t d = 0; d < d_len; ++d) acc[d] *= correction;
  for (int j = first; j < valid; ++j) {
    const float p = s[j];
    const float* v = vrows + j * d_len;
    for (int64_t d = 0; d < d_len; ++d) acc[d] += p * v[d];
  }
}

template <int D>
inline float dot(const float* a, const float* b, int64_t dim) {
  const int64_t d_len = D > 0 ? D : dim;
  float lanes[16] = {0.0f};
  int64_t d = 0;
  for (; d + 16 <= d_len; d += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += a[d + l] * b[d + l];
  float total = 0.0f;
  for (; d < d_len; ++d) total += a[d] * b[d];
  for (int l = 0; l < 16; ++l) total += lanes[l];
  return total;
}

// One row's scores against the chunk's 16 keys (kt, K transposed [dim][kChunk]), each the same float as dot<D>
// gives it (the direct path's), so a token's attention does not depend on how its step split the prompt: the
// products past the last whole 16 first, then each lane l (products l, l + 16, ...) summed apart and added in turn.
template <int D>
inline void tile_scores(const float* q, const float* kt, int64_t dim, float* scores) {
  const int64_t d_len = D > 0 ? D : dim, whole = d_len / 16 * 16;
  for (int j = 0; j < kChunk; ++j) scores[j] = 0.0f;
  for (int64_t d = whole; d < d_len; ++d) {
    const float qd = q[d];
    for (int j = 0; j < kChunk; ++j) scores[j] += qd * kt[d * kChunk + j];
  }
  for (int64_t l = 0; l < 16; ++l) {
    float lane[kChunk] = {0.0f};
    for (int64_t d = l; d < whole; d += 16) {
      const float qd = q[d];
      for (int j = 0; j < kChunk; ++j) lane[j] += qd * kt[d * kChunk + j];
    }
    for (int j = 0; j < kChunk; ++j) scores[j] += lane[j];
  }
}

// One 16-key chunk for one KV head's rows, generic loops. kt: K rows [kChunk][dim] (direct) or K transposed
// [dim][kChunk] (tile); vr: V rows [kChunk][dim].
template <int D>
void generic_chunk(const HeadRows& h, const float* kt, const float* vr, int64_t k0, int n, bool direct,
                   int64_t dim) {
  float scores[kChunk];
  for (int64_t r = 0; r < h.rows; ++r) {
    const int64_t pos = h.first_pos + r / h.groups;
    const int valid = static_cast<int>(std::min<int64_t>(n, pos - k0 + 1));
    // With a window the row sees keys from pos - window + 1 on: those before it in this chunk are masked.
    const int first = h.window > 0 ? static_cast<int>(std::clamp<int64_t>(pos - h.window + 1 - k0, 0, kChunk)) : 0;
    if (valid <= first) continue;
    const float* q = h.q + r * dim;
    if (direct) {
      for (int j = 0; j < kChunk; ++j) scores[j] = j < valid ? dot<D>(q, kt + j * dim, dim) : 0.0f;
    } else {
      tile_scores<D>(q, kt, dim, scores);
    }
    if (h.softcap > 0.0f)
      for (int j = first; j < valid; ++j) scores[j] = h.softcap * std::tanh(scores[j] / h.softcap);
    fold_scores<D>(scores, first, valid, h.max[r], h.sum[r], h.acc + r * dim, vr, dim);
  }
}

#if defined(__AVX512F__)
// The same with AVX-512 (head_dim a multiple of 16). Direct path: one dot product per key and row. Tile path:
// four rows' 16 scores as four independent FMA chains over the transposed chunk.
template <int D>
void simd_chunk(const HeadRows& h, const float* kt, const float* vr, int64_t k0, int n, bool direct) {
  alignas(64) float probs[kChunk];
  auto finish_row = [&](int64_t r, __m512 scores, int valid) {
    float* acc = h.acc + r * D;
    _mm512_store_ps(probs, fold16<D>(scores, valid, h.max[r], h.sum[r], acc));
    accumulate_values<D>(probs, valid, vr, acc);
  };
  auto valid_keys = [&](int64_t r) {
    return static_cast<int>(std::min<int64_t>(n, h.first_pos + r / h.groups - k0 + 1));
  };
  if (direct) {
    alignas(64) float dots[kChunk];
    for (int64_t r = 0; r < h.rows; ++r) {
      const int valid = valid_keys(r);
      if (valid <= 0) continue;
      const float* q = h.q + r * D;
      __m512 qv[D / 16];
      for (int v = 0; v < D / 16; ++v) qv[v] = _mm512_loadu_ps(q + 16 * v);
      for (int j = 0; j < valid; ++j) {
        __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kt + j * D));
        for (int v = 1; v < D / 16; ++v) a = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(kt + j * D + 16 * v), a);
        dots[j] = lane_tree_sum(a);
      }
      finish_row(r, _mm512_maskz_load_ps(static_cast<__mmask16>((1u << valid) - 1u), dots), valid);
    }
    return;
  }
  // Rows whose token lies before the chunk see none of its keys (rows are ordered by token).
  const int64_t first_seeing = std::max<int64_t>(0, (k0 - h.first_pos) * h.groups) / 4 * 4;
  for (int64_t rb = first_seeing; rb < h.rows; rb += 4) {
    __m512 scores[4];
    lane_tree<D, 0, 1>(h.q + rb * D, kt, scores);
    for (int b = 0; b < 4 && rb + b < h.rows; ++b) {
      const int valid = valid_keys(rb + b);
      if (valid > 0) finish_row(rb + b, scores[b], valid);
    }
  }
}
#endif

template <typename cache_t, typename query_t, int D>
void run_item(const Problem<cache_t, query_t>& p, const WorkItem& item, Accumulator& st, std::vector<float>& kbuf,
              std::vector<float>& vbuf) {
  const int64_t dim = D > 0 ? D : p.head_dim;
  const int64_t groups = p.heads / p.kv_heads, kv_heads = p.kv_heads, tokens = item.num_tokens;
  const int64_t head_rows = tokens * groups;
  const int32_t* table = p.block_tables + item.seq * p.table_width;
  const int64_t q_start = p.query_start[item.seq];
  const int64_t q_len = p.query_start[item.seq + 1] - q_start;
  const int64_t context = p.seq_lens[item.seq] - q_len;  // tokens cached before this step
  st.reset(kv_heads * head_rows, dim);
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t g = 0; g < groups; ++g) {
        const query_t* src = p.query + (q_start + item.first_token + t) * p.query_stride + (h * groups + g) * dim;
        float* dst = st.q.data() + ((h * tokens + t) * groups + g) * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] = to_float(src[d]) * p.scale;
      }
  // Keys [seen, end) cover every row of the tile; token t sees keys [0, context + first_token + t], or with a
  // window only the last `window` of them (so the first row's window starts the walk). Chunks start at multiples of
  // kChunk, the first one at `begin`, so a row's online softmax takes the same steps and gives the same bits whichever
  // item (a decode, a prefill tile) holds it; that chunk's keys before `seen` are masked and never read (their blocks
  // may have been given back).
  const int64_t first_pos = context + item.first_token;
  const int64_t end = first_pos + tokens;
  const int64_t seen = p.window > 0 ? std::max<int64_t>(0, first_pos - p.window + 1) : 0;
  const int64_t begin = seen / kChunk * kChunk;
  const bool direct = head_rows <= kDirectMaxRows;
  const int64_t head_stride = kChunk * dim;  // one KV head's chunk in kbuf / vbuf
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
  constexpr bool kAvx2 = D > 0 && D % 8 == 0;
#else
  constexpr bool kAvx2 = false;
#endif
  // The AVX2 path reads a float32 pool's rows where they lie (V always, K for decodes): a decode's context is
  // read once instead of copied and read again.
  const bool avx2 = kAvx2 && !p.limited();
  const bool in_place = avx2 && std::is_same_v<cache_t, float>;
  const bool convert_v = !in_place, convert_k = !in_place || !direct;
  for (int64_t pos = seen; pos < std::min<int64_t>(seen + kPrefetchAhead, end); ++pos) prefetch_key(p, table, pos);
  for (int64_t k0 = begin; k0 < end; k0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, end - k0));
    // Where each of the chunk's keys sits in the pool; the block table is walked without a division per key. Keys
    // before the window (masked) repeat its first key's place.
    const int skip = static_cast<int>(std::max<int64_t>(0, seen - k0));
    int64_t bases[kChunk];
    int64_t block = (k0 + skip) / p.block_size, offset = (k0 + skip) % p.block_size;
    for (int j = skip; j < n; ++j) {
      if (k0 + j + kPrefetchAhead < end) prefetch_key(p, table, k0 + j + kPrefetchAhead);
      bases[j] = (table[block] * p.block_size + offset) * kv_heads * p.row;
      if (++offset == p.block_size) {
        offset = 0;
        ++block;
      }
    }
    for (int j = 0; j < skip; ++j) bases[j] = bases[skip];
    // Convert the chunk's K/V rows of every KV head to float (dequantizing the codes of an int8 / fp8 pool: the
    // scale is a multiply, so a quantized pool costs no pass of its own). A token's KV heads sit side by side in
    // the pool, so this reads each block front to back.
    if (convert_v || convert_k)
      for (int j = 0; j < n; ++j)
        for (int64_t h = 0; h < kv_heads; ++h) {
          const cache_t* k = p.k_cache + bases[j] + h * p.row;
          const cache_t* v = p.v_cache + bases[j] + h * p.row;
          float* vd = vbuf.data() + h * head_stride + j * dim;
          float* kd = kbuf.data() + h * head_stride;
          if (convert_v) {
            const float vs = row_scale(v, dim);
            for (int64_t d = 0; d < dim; ++d) vd[d] = kQuantized<cache_t> ? to_float(v[d]) * vs : to_float(v[d]);
          }
          if (!convert_k) continue;
          const float ks = row_scale(k, dim);
          if (direct) {
            for (int64_t d = 0; d < dim; ++d) kd[j * dim + d] = kQuantized<cache_t> ? to_float(k[d]) * ks : to_float(k[d]);
          } else {
            for (int64_t d = 0; d < dim; ++d) kd[d * kChunk + j] = kQuantized<cache_t> ? to_float(k[d]) * ks : to_float(k[d]);
          }
        }
    if (!direct)
      for (int64_t h = 0; h < kv_heads; ++h)
        for (int j = n; j < kChunk; ++j)
          for (int64_t d = 0; d < dim; ++d) kbuf[h * head_stride + d * kChunk + j] = 0.0f;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t r0 = h * head_rows;
      const HeadRows rows{st.q.data() + r0 * dim, st.acc.data() + r0 * dim, st.max.data() + r0, st.sum.data() + r0,
                          head_rows, groups, first_pos, p.window, p.softcap};
      const float* kt = kbuf.data() + h * head_stride;
      const float* vr = vbuf.data() + h * head_stride;
#if defined(__AVX512F__)
      if constexpr (D > 0 && D % 16 == 0) {
        if (!p.limited()) {
          simd_chunk<D>(rows, kt, vr, k0, n, direct);
          continue;
        }
      }
#endif
      if constexpr (kAvx2) {
        if (avx2) {
          // Row pointers: into the pool or the converted chunk. Keys past n repeat the first (finite, masked).
          const float* k_rows[kChunk];
          const float* v_rows[kChunk];
          for (int j = 0; j < kChunk; ++j) {
            const int key = j < n ? j : 0;
            if constexpr (std::is_same_v<cache_t, float>) {
              k_rows[j] = in_place && direct ? p.k_cache + bases[key] + h * dim : kt + key * dim;
              v_rows[j] = in_place ? p.v_cache + bases[key] + h * dim : vr + key * dim;
            } else {
              k_rows[j] = kt + key * dim;
              v_rows[j] = vr + key * dim;
            }
          }
          avx2::chunk<D>(rows, kt, k_rows, v_rows, k0, n, direct);
          continue;
        }
      }
      generic_chunk<D>(rows, kt, vr, k0, n, direct, dim);
    }
  }
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t r = (h * tokens + t) * groups + g;
        query_t* dst = p.out + ((q_start + item.first_token + t) * p.heads + h * groups + g) * dim;
        const float inv = 1.0f / st.sum[r];
        const float* a = st.acc.data() + r * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] = from_float<query_t>(a[d] * inv);
      }
}

// Items of (sequence, tile of query tokens). A tile holds about kTargetRows rows; with `most` above that, a long
// prompt's tiles grow toward `most` tokens while the prompt still gives each thread four of them: every tile reads
// all its keys once per KV head, so at 8,000 tokens tiles of 64 read the KV 125 times over, more than the AMX
// flash kernel's cores could take from memory (its 4,096-token chunk after 3,904 ran 1.6x faster in 512-token tiles).
std::vector<WorkItem> plan_items(const int32_t* query_start, int64_t num_seqs, int64_t groups, int64_t most = 0) {
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

template <typename cache_t, typename query_t, int D>
void run_all(const Problem<cache_t, query_t>& p, const std::vector<WorkItem>& items) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<cache_t, c10::BFloat16> && std::is_same_v<query_t, c10::BFloat16> && D > 0 &&
                D % 32 == 0) {
    if (!p.limited()) {
      Cascade<D> cascade(p, p.num_seqs, at::get_num_threads());
      if (!cascade.work.empty())
        run_items(cascade.work, [&] {
          return [runner = Bf16ItemRunner<D>(p, cascade)](const PrefixWork& work) mutable { runner.prefix(work); };
        });
#if FRAME_PAGED_AMX
      if (amx::permitted() && amx::FlashPrefill<D>::serves(p)) {
        run_items(plan_items(p.query_start, p.num_seqs, p.heads / p.kv_heads, kFlashTokens),
                  [&] { return Bf16ItemRunner<D>(p, cascade); });
        return;
      }
#endif
      run_items(items, [&] { return Bf16ItemRunner<D>(p, cascade); });
      return;
    }
  }
#endif
  run_items(items, [&] {
    return [&p, st = Accumulator(), kbuf = std::vector<float>(p.kv_heads * kChunk * p.head_dim),
            vbuf = std::vector<float>(p.kv_heads * kChunk * p.head_dim)](const WorkItem& item) mutable {
      run_item<cache_t, query_t, D>(p, item, st, kbuf, vbuf);
    };
  });
}

template <typename cache_t, typename query_t>
void dispatch_dim(const Problem<cache_t, query_t>& p, const std::vector<WorkItem>& items) {
  switch (p.head_dim) {
    case 64: return run_all<cache_t, query_t, 64>(p, items);
    case 128: return run_all<cache_t, query_t, 128>(p, items);
    default: return run_all<cache_t, query_t, 0>(p, items);
  }
}

// True when each token's [heads, D] row is contiguous (tokens themselves may be strided, as columns of QKV).
bool rows_contiguous(const at::Tensor& t) {
  return t.dim() == 3 && t.stride(2) == 1 && (t.size(1) == 1 || t.stride(1) == t.size(2));
}

// Quantize one row of D values into D codes and the row's float32 scale (max |x| / qmax; 1 for a row of zeros),
// rounding as the torch reference (frame.interfaces.kv_dtype.quantize_rows) does: int8 to nearest even, fp8 by c10.
template <typename code_t, typename value_t>
void quantize_row(const value_t* x, int64_t dim, code_t* out) {
  constexpr float qmax = std::is_same_v<code_t, int8_t> ? 127.0f : 448.0f;
  float amax = 0.0f;
  for (int64_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(to_float(x[d])));
  float scale = amax / qmax;
  if (!(scale > 0.0f)) scale = 1.0f;
  for (int64_t d = 0; d < dim; ++d) {
    const float scaled = to_float(x[d]) / scale;
    if constexpr (std::is_same_v<code_t, int8_t>)
      out[d] = static_cast<int8_t>(std::clamp(std::nearbyint(scaled), -qmax, qmax));
    else
      out[d] = c10::Float8_e4m3fn(scaled);
  }
  std::memcpy(reinterpret_cast<char*>(out + dim), &scale, sizeof scale);
}

// Quantize each new token's K and V rows ([tokens, kv_heads, D], a float dtype, rows contiguous) into its slot of
// an int8 / fp8 pool ([blocks, block_size, kv_heads, D + 4]).
void write_quantized_slots(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                           const at::Tensor& slot_mapping) {
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "slot mapping must be int64");
  TORCH_CHECK(key.scalar_type() == value.scalar_type(), "new K and V must share a dtype");
  const at::Tensor kc = rows_contiguous(key) ? key : key.contiguous();
  const at::Tensor vc = rows_contiguous(value) ? value : value.contiguous();
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t tokens = kc.size(0), kv_heads = kc.size(1), dim = kc.size(2), row = dim + kScaleBytes;
  TORCH_CHECK(k_cache.size(-1) == row && k_cache.size(-2) == kv_heads, "a quantized cache's rows must be head_dim + 4");
  const int64_t num_slots = k_cache.numel() / (kv_heads * row);
  const int64_t* sp = slots.data_ptr<int64_t>();
  auto store = [&](auto* ks, auto* vs, auto* kd, auto* vd) {
    const int64_t k_step = kc.stride(0), v_step = vc.stride(0);
    for (int64_t t = 0; t < tokens; ++t) {
      TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "slot ", sp[t], " is outside the cache");
      for (int64_t h = 0; h < kv_heads; ++h) {
        quantize_row(ks + t * k_step + h * dim, dim, kd + (sp[t] * kv_heads + h) * row);
        quantize_row(vs + t * v_step + h * dim, dim, vd + (sp[t] * kv_heads + h) * row);
      }
    }
  };
  auto with_codes = [&](auto* ks, auto* vs) {
    if (k_cache.scalar_type() == at::kChar)
      return store(ks, vs, k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>());
    return store(ks, vs, k_cache.data_ptr<c10::Float8_e4m3fn>(), v_cache.data_ptr<c10::Float8_e4m3fn>());
  };
  switch (kc.scalar_type()) {
    case at::kFloat: return with_codes(kc.data_ptr<float>(), vc.data_ptr<float>());
    case at::kBFloat16: return with_codes(kc.data_ptr<c10::BFloat16>(), vc.data_ptr<c10::BFloat16>());
    case at::kHalf: return with_codes(kc.data_ptr<c10::Half>(), vc.data_ptr<c10::Half>());
    default: TORCH_CHECK(false, "unsupported K/V dtype ", kc.scalar_type());
  }
}

bool is_quantized(const at::Tensor& cache) {
  return cache.scalar_type() == at::kChar || cache.scalar_type() == at::kFloat8_e4m3fn;
}

// Copy each new token's K and V rows ([tokens, kv_heads, D], the cache's dtype, rows contiguous) to its slot.
void write_slots(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                 const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.scalar_type() == k_cache.scalar_type() && value.scalar_type() == v_cache.scalar_type(),
              "new K/V must be in the cache's dtype");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "slot mapping must be int64");
  const at::Tensor kc = rows_contiguous(key) ? key : key.contiguous();
  const at::Tensor vc = rows_contiguous(value) ? value : value.contiguous();
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t tokens = kc.size(0), row = kc.size(1) * kc.size(2);
  const int64_t bytes = row * kc.element_size(), num_slots = k_cache.numel() / std::max<int64_t>(row, 1);
  const int64_t k_step = kc.stride(0) * kc.element_size(), v_step = vc.stride(0) * vc.element_size();
  const int64_t* sp = slots.data_ptr<int64_t>();
  auto* kd = static_cast<char*>(k_cache.data_ptr());
  auto* vd = static_cast<char*>(v_cache.data_ptr());
  const auto* ks = static_cast<const char*>(kc.data_ptr());
  const auto* vs = static_cast<const char*>(vc.data_ptr());
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "slot ", sp[t], " is outside the cache");
    std::memcpy(kd + sp[t] * bytes, ks + t * k_step, bytes);
    std::memcpy(vd + sp[t] * bytes, vs + t * v_step, bytes);
  }
}

void attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
               double scale, int64_t window, double softcap, const std::optional<at::Tensor>& prompt);

// A step whose attention costs far more than reading its context once (a prefill: every key is read by every
// query tile) over a quantized pool, with bfloat16 queries on a CPU with AVX-512 BF16: the blocks the step reads are
// dequantized once into a bfloat16 scratch pool and attended by the bfloat16 path (AMX tiles where the CPU has
// them), instead of being widened chunk by chunk on the float path for every tile. Decodes (each key read once)
// stay on the float path, which reads the codes in place. Returns false when the step does not qualify.
bool attend_through_bfloat16(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& tables, const at::Tensor& starts,
                             const at::Tensor& lens, double scale, int64_t window, double softcap,
                             const std::optional<at::Tensor>& prompt) {
#if defined(__AVX512BF16__)
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2), row = k_cache.size(3);
  const int64_t dim = row - kScaleBytes, seqs = lens.numel(), width = tables.size(1);
  if (query.scalar_type() != at::kBFloat16 || dim % 32 != 0 || window > 0 || softcap > 0.0) return false;
  const int32_t* sl = lens.data_ptr<int32_t>();
  const int32_t* qs = starts.data_ptr<int32_t>();
  const int32_t* tp = tables.data_ptr<int32_t>();
  int64_t work = 0, context = 0;  // query x key pairs, and keys read
  for (int64_t s = 0; s < seqs; ++s) {
    work += static_cast<int64_t>(qs[s + 1] - qs[s]) * sl[s];
    context += sl[s];
  }
  constexpr int64_t kMinReuse = 32;  // a key read by at least this many queries on average
  if (work < kMinReuse * context) return false;
  std::vector<int32_t> used;
  for (int64_t s = 0; s < seqs; ++s)
    used.insert(used.end(), tp + s * width, tp + s * width + (sl[s] + block_size - 1) / block_size);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  const auto n = static_cast<int64_t>(used.size());
  const auto opts = k_cache.options().dtype(at::kBFloat16);
  at::Tensor k = at::empty({n, block_size, kv_heads, dim}, opts);
  at::Tensor v = at::empty({n, block_size, kv_heads, dim}, opts);
  at::Tensor remapped = at::empty(tables.sizes(), tables.options());
  int32_t* rp = remapped.data_ptr<int32_t>();
  std::fill(rp, rp + remapped.numel(), 0);
  for (int64_t s = 0; s < seqs; ++s)
    for (int64_t b = 0; b < (sl[s] + block_size - 1) / block_size; ++b)
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
  return true;
#else
  return false;
#endif
}

// `prompt` (bool [seqs], optional): the sequences whose new tokens are prompt tokens, which the bfloat16 path gives
// its prefill kernel however few they are (bf16_path.h, Bf16ItemRunner).
void attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
               double scale, int64_t window, double softcap, const std::optional<at::Tensor>& prompt) {
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
  if (is_quantized(k_cache) &&
      attend_through_bfloat16(out, query, k_cache, v_cache, tables, starts, lens, scale, window, softcap, prompt))
    return;
  TORCH_CHECK(query.size(2) == head_dim && heads % kv_heads == 0, "query heads must group over the KV heads");
  const auto items = plan_items(starts.data_ptr<int32_t>(), lens.numel(), heads / kv_heads);
  auto run = [&](auto* k, auto* v, auto* q, auto* o) {
    using cache_t = std::remove_const_t<std::remove_pointer_t<decltype(k)>>;
    using query_t = std::remove_const_t<std::remove_pointer_t<decltype(q)>>;
    Problem<cache_t, query_t> p{q, o, k, v, tables.data_ptr<int32_t>(), starts.data_ptr<int32_t>(),
                                lens.data_ptr<int32_t>(), tables.size(1), k_cache.size(1), heads, kv_heads,
                                head_dim, static_cast<float>(scale), query.stride(0), lens.numel(), window,
                                static_cast<float>(softcap), row,
                                prompts.defined() ? prompts.data_ptr<bool>() : nullptr};
    dispatch_dim<cache_t, query_t>(p, items);
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

// Store the step's new K/V: copied into a float pool (already in its dtype), quantized into an int8 / fp8 one.
void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
           const at::Tensor& slot_mapping) {
  if (is_quantized(k_cache))
    write_quantized_slots(key, value, k_cache, v_cache, slot_mapping);
  else
    write_slots(key, value, k_cache, v_cache, slot_mapping);
}

// What a layer calls: store the step's new K/V, then attend (one dispatch instead of several per layer).
void forward(at::Tensor& out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
             at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
             const at::Tensor& query_start_loc, const at::Tensor& seq_lens, double scale, int64_t window,
             double softcap, const std::optional<at::Tensor>& prompt) {
  write_kv(key, value, k_cache, v_cache, slot_mapping);
  attention(out, query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, window, softcap, prompt);
}

}  // namespace

TORCH_LIBRARY(frame_cpu_paged, m) {
  m.def("attention(Tensor(a!) out, Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor query_start_loc, Tensor seq_lens, float scale, int window, float softcap, Tensor? prompt=None) -> ()");
  m.def("forward(Tensor(a!) out, Tensor query, Tensor key, Tensor value, Tensor(b!) k_cache, Tensor(c!) v_cache, "
        "Tensor slot_mapping, Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, float scale, int window, "
        "float softcap, Tensor? prompt=None) -> ()");
  m.def("write(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(frame_cpu_paged, CPU, m) {
  m.impl("attention", &attention);
  m.impl("forward", &forward);
  m.impl("write", &write_kv);
}
