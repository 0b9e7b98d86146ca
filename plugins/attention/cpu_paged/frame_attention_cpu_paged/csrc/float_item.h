// The float path's per-item driver: an item's queries gathered and scaled, its keys walked through the block table
// in 16-key chunks (prefetched ahead, converted or dequantized to float32, or read in place by the AVX2 path), each
// chunk handed to the per-chunk kernels of float_chunk.h or avx2_path.h, and the rows written out.
#pragma once

#include "avx2_path.h"
#include "common.h"
#include "convert.h"
#include "float_chunk.h"

#include <type_traits>
#include <vector>

namespace frame_cpu_paged {

constexpr int kPrefetchAhead = 24;  // keys: about one chunk of compute ahead of the loads

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

}  // namespace frame_cpu_paged
