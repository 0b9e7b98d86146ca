// Prefill items of the bfloat16 path on AMX, blocked flash-style with the scores transposed: for each KV head, the
// item's query rows go in blocks of 16 against 32-key sub-steps of the paged pool, both products on tiles (float32
// accumulate), the online softmax on vectors.
//
// Why transposed: the earlier AMX prefill (amx_tile_rows in bf16_rows.h) scored S = Q K^T, one row per vector, so
// each row's softmax step needed horizontal max and sum reductions and a rescale of its own; at 2,000 tokens and
// more those vector instructions, not the tiles, were the bound. Here the tiles compute S^T = K Q^T: vector j holds
// key j's scores for 16 query rows, so a step's max and sum are 31 vertical max / add instructions for 16 rows,
// and exp runs once per 16 scores with nothing else around it.
// - Scores: S^T [16 keys][16 rows] += K [16 keys][32 dims] . Q^T, K's rows copied from the pool once per step and
//   KV head into a compact buffer (a 16-key tile never crosses a block: block sizes are a multiple of 16), Q^T the
//   block's queries as dimension pairs ([D / 32][16 pairs][16 rows], built once per item).
// - Values: O^T [16 dims][16 rows] += V^T [16 dims][32 keys] . P^T, P^T the step's probabilities as key pairs
//   ([16 pairs][16 rows]: two vectors to bfloat16 and one permute per pair) and V^T the step's values transposed,
//   once per step and KV head for all the item's row blocks. O^T lives in memory between steps.
// - The softmax rescales lazily: a row's reference maximum moves only when a score exceeds it by 2^8 (then O^T and
//   the sum are rescaled); below that the probabilities are at most 256, exact enough in float32 sums and bfloat16
//   products. Scores are scaled inside the exponent (exp2 of s * scale * log2(e) - m * scale * log2(e)).
// - Causal masking: a row block whose tokens all lie before a step's first key skips the step (no tile work);
//   steps that reach past a block's first token mask per key and row.
// - Overlap (D = 64): a step's (row block, sub-step) units run as one stream; the tiles' work for the next unit's
//   scores and the last unit's P^T . V is issued in pieces inside the current unit's softmax loop, so the tile unit
//   and the vector units run side by side (stream, tile_piece). With random data the tile unit is the bound: eight
//   products and two score stores a unit.//
// This file holds the kernel's schedule: per item and KV head, the walk over steps of keys, the copies of K, V^T and
// Q^T they need, the prefetches, and the streams of (row block, sub-step) units. The tiles' work is in
// amx_flash_tiles.h, the softmax in amx_flash_softmax.h, the aligned storage and transposes in amx_flash_layout.h.
#pragma once

#include "amx_flash_layout.h"
#include "amx_flash_softmax.h"
#include "amx_tiles.h"
#include "common.h"

#include <vector>

#if FRAME_PAGED_AMX
namespace frame_cpu_paged::amx {

template <int D>
class FlashPrefill : public FlashSoftmax<D> {
 public:
  using bf16 = c10::BFloat16;

  explicit FlashPrefill(const Problem<bf16, bf16>& p) : FlashSoftmax<D>(p) {}

  // True when this kernel can serve the problem's prefill items (the values' product goes four 16-dim tiles at a
  // time; a 16-key tile must lie in one block; no sliding window or soft-cap: it masks only keys past each row's
  // token, and softmaxes the plain scores).
  static bool serves(const Problem<bf16, bf16>& p) {
    return D % 64 == 0 && p.block_size % 16 == 0 && p.window == 0 && p.softcap <= 0.0f;
  }

  // One item (a tile of one sequence's new tokens, every head): writes its rows of p.out.
  void operator()(const WorkItem& item) {
    const int64_t groups = p_.heads / p_.kv_heads, tokens = item.num_tokens, rows = tokens * groups;
    const int64_t blocks = (rows + 15) / 16;
    const int64_t q_start = p_.query_start[item.seq];
    const int64_t q_len = p_.query_start[item.seq + 1] - q_start;
    const int64_t first_pos = p_.seq_lens[item.seq] - q_len + item.first_token;
    const int32_t* table = p_.block_tables + item.seq * p_.table_width;
    qt_.resize(blocks * (D / 32) * 256);
    acc_.resize(blocks * kAccStride);
    pos_.resize(blocks * 16);
    last_.resize(blocks);
    // Row r of a KV head is token r / groups, query head r % groups of that KV head; padding rows never see a key.
    for (int64_t r = 0; r < blocks * 16; ++r) pos_[r] = r < rows ? static_cast<int32_t>(first_pos + r / groups) : -1;
    for (int64_t b = 0; b < blocks; ++b) last_[b] = pos_[std::min(b * 16 + 15, rows - 1)];
    Tiles tiles;
    for (int64_t h = 0; h < p_.kv_heads; ++h) {
      load_queries(item, q_start, h, rows, groups);
      std::fill(acc_.begin(), acc_.end(), 0.0f);
      max_.assign(blocks * 16, kMasked);
      sum_.assign(blocks * 16, 0.0f);
      sweep(table, h, first_pos + tokens, blocks);
      write_out(item, q_start, h, rows, groups);
    }
  }

 private:
  using Base = FlashSoftmax<D>;
  using typename Base::Pending;
  using typename Base::TileWork;
  using Base::kKeys, Base::kSubs, Base::kStep, Base::kResident, Base::kAccStride;
  using Base::p_, Base::kc_, Base::vt_, Base::qt_, Base::acc_, Base::max_, Base::sum_, Base::pos_, Base::last_;
  using Base::ahead_, Base::sent_, Base::zeros_;
  using Base::scores, Base::values, Base::softmax, Base::load_acc, Base::store_acc, Base::acc_of;

  // Q^T of every row block as dimension pairs: qt_[b][c][i][lane] = (q[lane][32c + 2i], q[lane][32c + 2i + 1]).
  // Each block's 16 rows of one 32-dim chunk are 16 vectors of 16 pairs, transposed in registers (a pair at a time
  // into qt_ had been 4% of the kernel; 1.02x).
  void load_queries(const WorkItem& item, int64_t q_start, int64_t h, int64_t rows, int64_t groups) {
    for (int64_t b = 0; b * 16 < rows; ++b) {
      const uint16_t* q[16];
      for (int l = 0; l < 16; ++l) {
        const int64_t r = b * 16 + l, t = r / groups, g = r % groups;
        q[l] = r < rows ? reinterpret_cast<const uint16_t*>(p_.query + (q_start + item.first_token + t) * p_.query_stride +
                                                            (h * groups + g) * D)
                        : nullptr;
      }
      for (int c = 0; c < D / 32; ++c) {
        __m512i v[16];
        for (int l = 0; l < 16; ++l) v[l] = q[l] != nullptr ? _mm512_loadu_si512(q[l] + 32 * c) : _mm512_setzero_si512();
        transpose16(v);
        for (int i = 0; i < 16; ++i) _mm512_store_si512(qt_.data() + (b * (D / 32) + c) * 256 + i * 16, v[i]);
      }
    }
  }

  // The step's V rows (zeros past the last key) transposed: vt_[d][k] = V[k][d], D rows of 32 keys, as the tiles'
  // first operand reads it. Key pairs are interleaved first (the pairs the tiles multiply), then each 16 x 16
  // block of pairs is transposed.
  void transpose_values(const uint16_t* const* values, uint16_t* vt) {
    for (int c = 0; c < D / 32; ++c) {
      __m512i lo[16], hi[16];  // key pair k: dims 32c + 8L + {0..3} (lo) and + {4..7} (hi) of each 128-bit lane L
      for (int k = 0; k < 16; ++k) {
        const __m512i a = _mm512_loadu_si512(values[2 * k] + 32 * c);
        const __m512i b = _mm512_loadu_si512(values[2 * k + 1] + 32 * c);
        lo[k] = _mm512_unpacklo_epi16(a, b);
        hi[k] = _mm512_unpackhi_epi16(a, b);
      }
      transpose16(lo);
      transpose16(hi);
      // After the transposes, lo[i] holds pair slot i of every key pair; slot i of lo is dim 8 (i / 4) + i % 4.
      auto* out = reinterpret_cast<uint32_t*>(vt);
      for (int i = 0; i < 16; ++i) {
        const int d = 32 * c + 8 * (i / 4) + i % 4;
        _mm512_storeu_si512(out + d * 16, lo[i]);
        _mm512_storeu_si512(out + (d + 4) * 16, hi[i]);
      }
    }
  }

  void sweep(const int32_t* table, int64_t h, int64_t end, int64_t blocks) {
    const int64_t token_stride = p_.kv_heads * D;  // elements between a block's consecutive keys
    const uint16_t* values[kStep];
    const bf16* k_tiles[kStep / 16];
    for (int64_t k0 = 0; k0 < end; k0 += kStep) {
      const int n = static_cast<int>(std::min<int64_t>(kStep, end - k0));
      // Each 16 keys of the step lie in one block, consecutive slots: a tile's rows, token_stride apart.
      for (int t = 0; t < kStep / 16; ++t) {
        const int64_t at = 16 * t < n ? offset(table, k0 + 16 * t) + h * D : 0;
        k_tiles[t] = 16 * t < n ? p_.k_cache + at : nullptr;
        for (int j = 16 * t; j < 16 * t + 16; ++j)
          values[j] = j < n ? reinterpret_cast<const uint16_t*>(p_.v_cache + at + (j % 16) * token_stride) : zeros_;
      }
      ahead_.clear();
      sent_ = 0;
      if (k0 + kStep < end) prefetch_step(table, h, k0 + kStep, end, token_stride);
      for (int sub = 0; sub * kKeys < n; ++sub) transpose_values(values + sub * kKeys, vt_.data() + sub * D * kKeys);
      copy_keys(k_tiles, n, token_stride);
      // Row blocks are in token order: those before the first that sees key k0 see none of this step.
      int64_t b = 0;
      while (b < blocks && last_[b] < k0) ++b;
      if constexpr (kResident) {
        if (b < blocks) stream(b, blocks, k0, n, k_tiles);
      } else {
        const size_t each = (ahead_.size() + (blocks - b) - 1) / std::max<int64_t>(1, blocks - b);
        for (; b < blocks; ++b) {
          send(each);
          step(b, k0, n, k_tiles);
        }
      }
      send(ahead_.size());
    }
  }

  // The step's K rows of this head, compact: kc_[t][c][16 keys][32 dims], tile t's chunk c 1 KB; k_tiles then
  // point there. Read from the pool at the heads' stride, a tile's 16 rows were 16 lines that L1 did not keep for
  // the step's next row block (the V^T and score buffers and the blocks' O^T pass through it meanwhile): the scores'
  // tile loads waited on L2. One copy per step serves every row block: the kernel went 1.14x faster.
  void copy_keys(const bf16** k_tiles, int n, int64_t token_stride) {
    for (int t = 0; 16 * t < n; ++t) {
      const auto* src = reinterpret_cast<const uint16_t*>(k_tiles[t]);
      uint16_t* dst = kc_.data() + t * (D / 32) * 512;
      for (int j = 0; j < 16; ++j)
        for (int c = 0; c < D / 32; ++c)
          _mm512_store_si512(dst + c * 512 + j * 32, _mm512_loadu_si512(src + j * token_stride + 32 * c));
      k_tiles[t] = reinterpret_cast<const bf16*>(dst);
    }
  }

  int64_t offset(const int32_t* table, int64_t key) const {
    return (table[key / p_.block_size] * p_.block_size + key % p_.block_size) * p_.kv_heads * D;
  }

  // The next `count` of ahead_'s lines into L2.
  void send(size_t count) {
    for (const size_t stop = std::min(ahead_.size(), sent_ + count); sent_ < stop; ++sent_) prefetch_line(ahead_[sent_]);
  }

  // The next step's K and V lines of this head (into ahead_), to be fetched into L2 while this step computes.
  void prefetch_step(const int32_t* table, int64_t h, int64_t k0, int64_t end, int64_t token_stride) {
    for (int64_t first = k0; first < std::min<int64_t>(k0 + kStep, end); first += 16) {
      const int64_t at = offset(table, first) + h * D;
      for (int64_t j = 0; j < std::min<int64_t>(16, end - first); ++j)
        for (int b = 0; b < D * 2; b += 64) {
          ahead_.push_back(reinterpret_cast<const char*>(p_.k_cache + at + j * token_stride) + b);
          ahead_.push_back(reinterpret_cast<const char*>(p_.v_cache + at + j * token_stride) + b);
        }
    }
  }

  // One row block against one step of keys [k0, k0 + n), sub-step by sub-step up to the block's last token. The
  // tiles' work is issued a sub-step ahead or behind the softmax on the vectors, so neither waits on the other's
  // stores: the next sub-step's scores go to the tiles before this one's softmax reads its own, and this one's
  // P^T . V waits until after the next softmax (unless that one must rescale O^T first).
  // Tiles: 0-3 O^T (D = 64: for the whole step), 4-5 the scores, 6 K, 7 Q^T; then 4 P^T, 5-7 V^T.
  void step(int64_t b, int64_t k0, int n, const bf16* const* k_tiles) {
    alignas(64) float s[2][kKeys * 16];
    alignas(64) uint32_t pt[2][16 * 16];
    float* acc = acc_of(b);
    const int subs = sub_steps(b, k0, n);
    scores(b, std::min(kKeys, n), k_tiles, s[0]);
    Pending pending;
    for (int sub = 0; sub < subs; ++sub) {
      if (sub + 1 < subs)
        scores(b, std::min(kKeys, n - (sub + 1) * kKeys), k_tiles + 2 * (sub + 1), s[(sub + 1) & 1]);
      softmax(b, k0 + sub * kKeys, std::min(kKeys, n - sub * kKeys), s[sub & 1], pt[sub & 1], acc, pending, nullptr);
      values(pending, acc);
      pending = {pt[sub & 1], vt_.data() + sub * D * kKeys};
    }
    values(pending, acc);
  }

  // Sub-steps of [k0, k0 + n) that row block b sees: up to its last token.
  int sub_steps(int64_t b, int64_t k0, int n) const {
    int subs = 0;
    while (subs * kKeys < n && k0 + subs * kKeys <= last_[b]) ++subs;
    return subs;
  }

  // Row blocks [b, blocks) against one step of keys [k0, k0 + n) with D = 64, as one stream of (row block,
  // sub-step) units: while the vectors take unit u's softmax, the tiles take unit u + 1's scores and unit u - 1's
  // P^T . V, also across row blocks (the tiles then swap one block's O^T for the next's), so only the step's first
  // scores and last product stand alone (1.05x over a pipeline per row block). The next step's lines are
  // prefetched a few per unit: asked for all at once, 512 lines held the core until the line fill buffers had
  // taken most of them (1.06x).
  void stream(int64_t b, int64_t blocks, int64_t k0, int n, const bf16* const* k_tiles) {
    alignas(64) float s[2][kKeys * 16];
    alignas(64) uint32_t pt[2][16 * 16];
    int64_t units = 0;
    for (int64_t c = b; c < blocks; ++c) units += sub_steps(c, k0, n);
    const size_t each = (ahead_.size() + units - 1) / units;
    int sub = 0, subs = sub_steps(b, k0, n);
    load_acc(acc_of(b));
    scores(b, std::min(kKeys, n), k_tiles, s[0]);
    Pending pending;
    for (int u = 0;; ++u) {
      send(each);
      const bool last = sub + 1 == subs;  // of this row block
      const int64_t nb = last ? b + 1 : b;
      const int nsub = last ? 0 : sub + 1;
      float* acc = acc_of(b);
      TileWork work{qt_.data() + nb * (D / 32) * 256, nb < blocks ? k_tiles + 2 * nsub : nullptr,
                    std::min(kKeys, n - nsub * kKeys), s[(u + 1) & 1], &pending, nullptr, nullptr};
      if (pending.pt != nullptr && pending.last) {  // the pending product ends the block before this one
        work.out_acc = acc_of(b - 1);
        work.in_acc = acc;
      }
      softmax(b, k0 + sub * kKeys, std::min(kKeys, n - sub * kKeys), s[u & 1], pt[u & 1], acc, pending, &work);
      pending = {pt[u & 1], vt_.data() + sub * D * kKeys, last};
      if (nb == blocks) break;
      if (last) subs = sub_steps(nb, k0, n);
      b = nb;
      sub = nsub;
    }
    values(pending, nullptr);
    store_acc(acc_of(b));
  }

  // O = (O^T)^T / sum, rounded to bfloat16, into the rows' places in p.out: each block's 16 x 16 pieces of O^T
  // transposed back on vectors.
  void write_out(const WorkItem& item, int64_t q_start, int64_t h, int64_t rows, int64_t groups) {
    alignas(64) float inv[16];
    for (int64_t b = 0; b * 16 < rows; ++b) {
      for (int r = 0; r < 16; ++r) inv[r] = b * 16 + r < rows ? 1.0f / sum_[b * 16 + r] : 0.0f;
      for (int v = 0; v < D / 16; ++v) {
        __m512i piece[16];
        for (int d = 0; d < 16; ++d)
          piece[d] = _mm512_loadu_si512(acc_of(b) + (16 * v + d) * 16);
        transpose16(piece);  // piece[r]: row r's dims 16v .. 16v + 15
        for (int r = 0; r < 16 && b * 16 + r < rows; ++r) {
          const int64_t row = b * 16 + r, t = row / groups, g = row % groups;
          bf16* dst = p_.out + ((q_start + item.first_token + t) * p_.heads + h * groups + g) * D + 16 * v;
          const __m512 o = _mm512_mul_ps(_mm512_castsi512_ps(piece[r]), _mm512_set1_ps(inv[r]));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(o));
        }
      }
    }
  }
};

}  // namespace frame_cpu_paged::amx
#endif
