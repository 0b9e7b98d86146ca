// Decode rows on AMX tiles (Sapphire Rapids and later), for the bfloat16 path: both products of a 32-key step of
// one KV head's rows (its grouped query heads) as tile multiplies.
//
// Why: on such a CPU `vdpbf16ps` issues about once per two cycles (benchmarks/bf16_peak.cpp: 1.8 G/s per core),
// and a decode row's scores and P.V took about 24 cycles per key and KV head in it, which made a batch-64 decode
// layer compute-bound (0.72 ms with the KV in cache, 0.99 ms from memory). A tile multiply does 16 x 16 x 32 in
// about 16 cycles, even with only 3 of its 16 rows in use.
// - Scores, transposed: S^T [16 keys][16 rows] = K [16 keys][32 dims] . Q^T, where K's rows load as a tile
//   straight from the pool (16 consecutive slots of one block, a row stride of kv_heads x head_dim) and Q^T is the
//   rows' queries in the tiles' pair layout, built once per item. No key is transposed or copied. A row's 32
//   scores are then one column of two stored tiles, gathered into two vectors for the online softmax.
// - Values: P [rows][32 keys] . V, P the softmax's bfloat16 pairs (what the vector path multiplies too) and V the
//   step's interleaved key pairs (vpairs_), which is the tiles' layout already; each 16-column slice of the
//   product lands in a tile that is stored and added to the rows' float32 accumulators (already rescaled by the
//   softmax), so the sums and their order match no other path, but are the same whatever the batch.
// Keys of the last, partial 16-key group are loaded from the pool as they lie (slots of the same block, possibly
// never written): their scores are masked before the softmax, and their V rows are zeros (interleave_values), so
// neither can reach a result.
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FRAME_PAGED_AMX 1

namespace frame_cpu_paged::amx {

// Linux hands a process AMX's tile state only when asked (arch_prctl, kernel 5.16+); the permission covers every
// thread. (The platform's kernels ask too; this plugin cannot rely on them being loaded.)
inline bool permitted() {
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023;
    constexpr long kXfeatureTiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTiledata) == 0;
  }();
  return ok;
}

// Palette 1, eight tiles of 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// This thread's tiles for the scope of one item.
class Tiles {
 public:
  Tiles() {
    static const TileConfig config;
    _tile_loadconfig(&config);
  }
  ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

// Q^T of `rows` (at most 16) query rows [rows][D] bfloat16 in the tiles' pair layout: for each 32-dim chunk c, 16
// rows of dim pairs, each holding the 16 query rows' pair (zero past `rows`): out [D / 32][16][16][2].
template <int D>
inline void transpose_queries(const uint16_t* q, int64_t rows, uint32_t* out) {
  for (int i = 0; i < D / 32 * 16 * 16; ++i) out[i] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto* pairs = reinterpret_cast<const uint32_t*>(q + r * D);
    for (int p = 0; p < D / 2; ++p) out[(p / 16) * 256 + (p % 16) * 16 + r] = pairs[p];
  }
}

// S^T for one or two 16-key groups: keys [16][D] at k0 (and k1 when two), row stride `stride` bytes, against
// qt (transpose_queries); scores [32 keys][16 rows] float32.
template <int D>
inline void scores(const uint16_t* k0, const uint16_t* k1, int64_t stride, const uint32_t* qt, float* s) {
  _tile_zero(0);
  if (k1 != nullptr) _tile_zero(1);
  for (int c = 0; c < D / 32; ++c) {
    _tile_loadd(6, qt + c * 256, 64);
    _tile_loadd(4, k0 + 32 * c, stride);
    _tile_dpbf16ps(0, 4, 6);
    if (k1 != nullptr) {
      _tile_loadd(5, k1 + 32 * c, stride);
      _tile_dpbf16ps(1, 5, 6);
    }
  }
  _tile_stored(0, s, 64);
  if (k1 != nullptr) _tile_stored(1, s + 256, 64);
}

// Scores of 16 query rows [16][D] (row-major, zero past the real rows) against a step's keys transposed to pairs
// (keys_t [D / 2][32], the vector tile path's layout, which is the tiles' layout for the second operand):
// s [16 rows][32 keys] float32.
template <int D>
inline void tile_scores(const uint16_t* q, const uint32_t* keys_t, float* s) {
  _tile_zero(0);
  _tile_zero(1);
  for (int c = 0; c < D / 32; ++c) {
    _tile_loadd(4, q + 32 * c, D * 2);
    _tile_loadd(6, keys_t + c * 16 * 32, 32 * 4);
    _tile_loadd(7, keys_t + c * 16 * 32 + 16, 32 * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
  }
  _tile_stored(0, s, 32 * 4);
  _tile_stored(1, s + 16, 32 * 4);
}

// acc [rows][D] += P . V: probs [16 rows][16 key pairs] (bfloat16 pairs, zero past the real rows and keys),
// vpairs [16 key pairs][D / 16][16] (interleave_values' layout), acc in vpairs' permuted column order.
template <int D>
inline void accumulate(const uint32_t* probs, const uint32_t* vpairs, int64_t rows, float* acc) {
  alignas(64) float part[16 * 16];
  _tile_loadd(4, probs, 64);
  for (int v = 0; v < D / 16; ++v) {
    _tile_zero(2);
    _tile_loadd(7, vpairs + v * 16, D / 16 * 64);
    _tile_dpbf16ps(2, 4, 7);
    _tile_stored(2, part, 64);
    for (int64_t r = 0; r < rows; ++r) {
      float* a = acc + r * D + 16 * v;
      _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_load_ps(part + 16 * r)));
    }
  }
}

}  // namespace frame_cpu_paged::amx
#endif
