// Prefill items of the bfloat16 path on AMX, blocked flash-style with the scores transposed: for each KV head, the
// item's query rows go in blocks of 16 against 32-key sub-steps of the paged pool, both products on tiles (float32
// accumulate), the online softmax on vectors.
//
// Why transposed: the earlier AMX prefill (amx_tile_rows in bf16_path.h) scored S = Q K^T, one row per vector, so
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
//   products and two score stores a unit.
#pragma once

#include "amx_tiles.h"
#include "common.h"

#include <new>
#include <vector>

#if FRAME_PAGED_AMX
namespace frame_cpu_paged::amx {

// 2^x for 16 lanes: 2^floor(x) * 2^f with f = x - floor(x) in [0, 1) (one vreduceps; vscalefps takes the floor
// of x itself) on a degree-3 polynomial (least-squares fit of the relative error: at most 8e-5, far below the
// bfloat16 rounding of the probabilities, 2e-3). Six instructions with the score's scaling where the degree-5
// polynomial on a rounded x took nine: the kernel ran 1.06x faster for the degree, 1.03x for vreduceps. Very
// negative x gives 0 (scalef underflows), never NaN.
inline __m512 exp2_ps(__m512 x) {
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(7.7907164e-2f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.2623319e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.957771e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.9992783e-1f));
  return _mm512_scalef_ps(p, x);
}

// Storage on 64-byte boundaries: a tile's 64-byte rows then each lie in one cache line. std::vector's default
// allocator gives 16 (malloc's), and the tiles' loads and stores of V^T, Q^T and O^T each touched two lines a row:
// aligned, the kernel ran 1.1x faster.
template <typename T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <typename U>
  bool operator==(const LineAligned<U>&) const { return true; }
  template <typename U>
  bool operator!=(const LineAligned<U>&) const { return false; }
};
template <typename T>
using LineVector = std::vector<T, LineAligned<T>>;

template <int D>
class FlashPrefill {
 public:
  using bf16 = c10::BFloat16;
  static constexpr int kKeys = 32;               // keys per sub-step: one P^T tile's depth
  // Sub-steps per step. Each row block's O^T goes between memory and the tiles once a step, and that swap (four
  // tile stores after the products, four loads) had cost a sixth of the kernel at 4 sub-steps: 16 ran 1.08x
  // faster, though the step's K and V^T (64 KB each) now stream from L2.
  static constexpr int kSubs = D == 64 ? 16 : 4;
  static constexpr int kStep = kKeys * kSubs;    // keys per step: V^T transposed once for every row block
  static constexpr bool kResident = D == 64;     // O^T stays in tiles 0-3 for a whole step (D = 128 needs 8)
  static constexpr float kLazy = 8.0f;           // log2 of how far a score may exceed its row's reference maximum
  // Floats between row blocks' O^T: 256 bytes over its size, so that one block's O^T does not lie a multiple of
  // 4 KB from the next's (the tiles' loads of the next block's O^T waited on the stores of the last block's, at
  // the same 12 low address bits; 1.05-1.1x).
  static constexpr int64_t kAccStride = D * 16 + 64;

  explicit FlashPrefill(const Problem<bf16, bf16>& p) : p_(p), kc_(kStep * D), vt_(kSubs * D * kKeys, 0) {}

  // True when this kernel can serve the problem's prefill items (the values' product goes four 16-dim tiles at a
  // time; a 16-key tile must lie in one block).
  static bool serves(const Problem<bf16, bf16>& p) { return D % 64 == 0 && p.block_size % 16 == 0; }

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

  // In-place transpose of 16 vectors of 16 32-bit lanes.
  static void transpose16(__m512i* r) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
      r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
      r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
      r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
      t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
      t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
      t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
      t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
      r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
      r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
      r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
      r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
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

  // A sub-step's P^T . V not yet added to O^T.
  struct Pending {
    const uint32_t* pt = nullptr;
    const uint16_t* vt = nullptr;
    bool last = false;  // the row block's last sub-step (stream)
  };

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

  // Tile work spread over a softmax (D = 64): the next sub-step's scores (k_tiles null: none) and the pending
  // P^T . V, in pieces the vector loop issues between its own instructions, so that the reorder buffer always
  // holds both kinds: issued whole before or after the softmax, the tiles' instructions sat at its head waiting
  // on each other while the vectors' filled it, and the two units took turns (spread: 1.04x).
  struct TileWork {
    const uint32_t* qt;
    const bf16* const* k_tiles;
    int n;
    float* s;
    Pending* pending;
    float* out_acc;  // not null: after the product, tiles 0-3 go here and come from in_acc
    float* in_acc;
  };

  // Piece k (0-15) of `work`. Tiles as in step(): 4-5 the scores, 6 K, 7 Q^T; then 4 P^T, 5-7 V^T.
  static void tile_piece(int k, TileWork& work) {
    if (work.k_tiles != nullptr) {
      switch (k) {
        case 0:
          _tile_zero(4);
          _tile_zero(5);
          _tile_loadd(7, work.qt, 64);
          _tile_loadd(6, work.k_tiles[0], 64);
          _tile_dpbf16ps(4, 6, 7);
          break;
        case 2:
          if (work.n > 16) {
            _tile_loadd(6, work.k_tiles[1], 64);
            _tile_dpbf16ps(5, 6, 7);
          }
          break;
        case 4:
          _tile_loadd(7, work.qt + 256, 64);
          _tile_loadd(6, work.k_tiles[0] + 512, 64);
          _tile_dpbf16ps(4, 6, 7);
          break;
        case 6:
          if (work.n > 16) {
            _tile_loadd(6, work.k_tiles[1] + 512, 64);
            _tile_dpbf16ps(5, 6, 7);
          }
          break;
        case 8:
          _tile_stored(4, work.s, 64);
          _tile_stored(5, work.s + 16 * 16, 64);
          break;
        default:
          break;
      }
    }
    Pending& pending = *work.pending;
    if (pending.pt == nullptr) return;
    switch (k) {
      case 9:
        _tile_loadd(4, pending.pt, 64);
        _tile_loadd(5, pending.vt, kKeys * 2);
        _tile_dpbf16ps(0, 5, 4);
        break;
      case 11:
        _tile_loadd(6, pending.vt + 16 * kKeys, kKeys * 2);
        _tile_dpbf16ps(1, 6, 4);
        break;
      case 13:
        _tile_loadd(7, pending.vt + 32 * kKeys, kKeys * 2);
        _tile_dpbf16ps(2, 7, 4);
        break;
      case 15:
        _tile_loadd(5, pending.vt + 48 * kKeys, kKeys * 2);
        _tile_dpbf16ps(3, 5, 4);
        pending = {};
        if (work.out_acc != nullptr) {
          store_acc(work.out_acc);
          load_acc(work.in_acc);
        }
        break;
      default:
        break;
    }
  }

  float* acc_of(int64_t b) { return acc_.data() + b * kAccStride; }

  // Tiles 0-3 from / to 64 dims of O^T (tile numbers must be constants, hence no loop).
  static void load_acc(float* acc) {
    _tile_loadd(0, acc, 64);
    _tile_loadd(1, acc + 256, 64);
    _tile_loadd(2, acc + 512, 64);
    _tile_loadd(3, acc + 768, 64);
  }
  static void store_acc(float* acc) {
    _tile_stored(0, acc, 64);
    _tile_stored(1, acc + 256, 64);
    _tile_stored(2, acc + 512, 64);
    _tile_stored(3, acc + 768, 64);
  }

  // S^T [32 keys][16 rows] of row block b against n keys (k_tiles: their two 16-key tiles), into s.
  void scores(int64_t b, int n, const bf16* const* k_tiles, float* s) {
    const uint32_t* qt = qt_.data() + b * (D / 32) * 256;
    _tile_zero(4);
    _tile_zero(5);
    for (int c = 0; c < D / 32; ++c) {
      _tile_loadd(7, qt + c * 256, 64);
      _tile_loadd(6, k_tiles[0] + 512 * c, 64);
      _tile_dpbf16ps(4, 6, 7);
      if (n > 16) {
        _tile_loadd(6, k_tiles[1] + 512 * c, 64);
        _tile_dpbf16ps(5, 6, 7);
      }
    }
    _tile_stored(4, s, 64);
    _tile_stored(5, s + 16 * 16, 64);
  }

  // The online softmax of row block b over keys [k0, k0 + n) with their scores s: P^T into pt. The probabilities
  // are first taken against the rows' reference maxima as they stand; only when some row's sum reaches 2^7 (a
  // score may then exceed its reference by the lazy margin) does a max pass decide which rows raise, and only
  // raised rows' probabilities change on the second pass (the others' bits are the first pass's). Skipping the
  // max pass in the common case made the kernel 1.06x faster. A rescale of O^T first adds the pending sub-step's
  // product (computed against the old reference).
  void softmax(int64_t b, int64_t k0, int n, const float* s, uint32_t* pt, float* acc, Pending& pending,
               TileWork* work) {
    // Scores of keys the rows cannot see (after a row's token, past the step's last key, padding rows) are masked.
    const Visible seen{_mm512_loadu_si512(pos_.data() + b * 16), k0, n,
                       n < kKeys || pos_[b * 16] < k0 + kKeys - 1};
    const __m512 c2 = _mm512_set1_ps(p_.scale * 1.4426950408889634f);
    float* max = max_.data() + b * 16;
    float* sum = sum_.data() + b * 16;
    __m512 ref = _mm512_loadu_ps(max);
    __m512 l = _mm512_loadu_ps(sum);
    __m512 total = probabilities(s, pt, _mm512_mul_ps(ref, c2), seen, work);
    // Below 2^7 in every row no score exceeds its reference by 2^7 (2^8 is the margin): no row raises.
    if (_mm512_cmp_ps_mask(total, _mm512_set1_ps(128.0f), _CMP_NLT_UQ) != 0) {
      const __m512 masked = _mm512_set1_ps(kMasked);
      __m512 top = masked;
      for (int j = 0; j < kKeys; ++j) {
        const __m512 x = _mm512_load_ps(s + 16 * j);
        top = _mm512_max_ps(top, seen.masking ? _mm512_mask_mov_ps(masked, seen(j), x) : x);
      }
      const __mmask16 raise = _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_sub_ps(top, ref), c2),
                                                 _mm512_set1_ps(kLazy), _CMP_GT_OQ);
      if (raise) {
        const __m512 next = _mm512_mask_mov_ps(ref, raise, top);
        // Exactly 1 in the lanes not raised (exp2_ps(0) is its polynomial's 0.99993): a row's sums must not depend
        // on whether another row of its block raised, or on which rows share its block.
        const __m512 correction = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), raise,
                                                     exp2_ps(_mm512_mul_ps(_mm512_sub_ps(ref, next), c2)));
        l = _mm512_mul_ps(l, correction);
        // Rows that saw keys before hold sums to rescale; rows that saw none hold zeros.
        if (_mm512_mask_cmp_ps_mask(raise, ref, _mm512_set1_ps(0.5f * kMasked), _CMP_GT_OQ)) {
          values(pending, acc);
          if constexpr (kResident) store_acc(acc);
          for (int d = 0; d < D; ++d)
            _mm512_storeu_ps(acc + 16 * d, _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * d), correction));
          if constexpr (kResident) load_acc(acc);
        }
        ref = next;
        _mm512_storeu_ps(max, ref);
        total = probabilities(s, pt, _mm512_mul_ps(ref, c2), seen, nullptr);
      }
    }
    _mm512_storeu_ps(sum, _mm512_add_ps(l, total));
  }

  // Which of a row block's rows see key k0 + j of a sub-step's n (masking false: all of them, every key).
  struct Visible {
    __m512i pos;
    int64_t k0;
    int n;
    bool masking;
    __mmask16 operator()(int j) const {
      return j < n ? _mm512_cmpge_epi32_mask(pos, _mm512_set1_epi32(static_cast<int32_t>(k0 + j))) : 0;
    }
  };

  // exp2(s * c2 - offset) of a sub-step's scores into P^T (pt, bfloat16 key pairs), returning each row's sum.
  __m512 probabilities(const float* s, uint32_t* pt, __m512 offset, const Visible& seen, TileWork* work) const {
    const __m512 c2 = _mm512_set1_ps(p_.scale * 1.4426950408889634f);
    // Key pair k's probabilities interleaved per row: (p[2k][row], p[2k + 1][row]), P^T as the tiles read it.
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 total = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int k = 0; k < kKeys / 2; ++k) {
      if (work != nullptr) tile_piece(k, *work);
      __m512 p0 = exp2_ps(_mm512_fmsub_ps(_mm512_load_ps(s + 32 * k), c2, offset));
      __m512 p1 = exp2_ps(_mm512_fmsub_ps(_mm512_load_ps(s + 32 * k + 16), c2, offset));
      if (seen.masking) {  // masked scores may be anything (NaN from a pool slot past the sequence): zero them here
        p0 = _mm512_maskz_mov_ps(seen(2 * k), p0);
        p1 = _mm512_maskz_mov_ps(seen(2 * k + 1), p1);
      }
      total = _mm512_add_ps(total, _mm512_add_ps(p0, p1));
      const __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);  // p0's 16 values, then p1's
      _mm512_store_si512(pt + 16 * k, _mm512_permutexvar_epi16(interleave, pair));
    }
    return total;
  }

  // O^T += V^T . P^T of the pending sub-step (if any), four 16-dim tiles at a time, so the four products overlap.
  void values(Pending& pending, float* acc) {
    if (pending.pt == nullptr) return;
    const uint16_t* vt = pending.vt;
    _tile_loadd(4, pending.pt, 64);
    pending = {};
    if constexpr (kResident) {
      _tile_loadd(5, vt, kKeys * 2);
      _tile_loadd(6, vt + 16 * kKeys, kKeys * 2);
      _tile_loadd(7, vt + 32 * kKeys, kKeys * 2);
      _tile_dpbf16ps(0, 5, 4);
      _tile_dpbf16ps(1, 6, 4);
      _tile_dpbf16ps(2, 7, 4);
      _tile_loadd(5, vt + 48 * kKeys, kKeys * 2);
      _tile_dpbf16ps(3, 5, 4);
    } else {
      for (int v = 0; v < D / 16; v += 4) {
        load_acc(acc + v * 256);
        _tile_loadd(5, vt + v * 16 * kKeys, kKeys * 2);
        _tile_loadd(6, vt + (v + 1) * 16 * kKeys, kKeys * 2);
        _tile_loadd(7, vt + (v + 2) * 16 * kKeys, kKeys * 2);
        _tile_dpbf16ps(0, 5, 4);
        _tile_dpbf16ps(1, 6, 4);
        _tile_dpbf16ps(2, 7, 4);
        _tile_loadd(5, vt + (v + 3) * 16 * kKeys, kKeys * 2);
        _tile_dpbf16ps(3, 5, 4);
        store_acc(acc + v * 256);
      }
    }
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

  const Problem<bf16, bf16>& p_;
  LineVector<uint16_t> kc_;                  // K of the step, compact (copy_keys)
  LineVector<uint16_t> vt_;                  // V^T of the step: [kSubs][D][kKeys] bfloat16
  LineVector<uint32_t> qt_;                  // Q^T pairs per row block: [blocks][D / 32][16][16]
  LineVector<float> acc_, max_, sum_;        // O^T per row block [blocks][D][16]; reference max and sum per row
  std::vector<int32_t> pos_;                 // each row's token position, -1 for padding rows
  std::vector<int32_t> last_;                // each row block's last token position
  std::vector<const char*> ahead_;          // the next step's lines to prefetch (prefetch_step)
  size_t sent_ = 0;                          // how many of them have gone out
  alignas(64) uint16_t zeros_[D] = {};
};

}  // namespace frame_cpu_paged::amx
#endif
