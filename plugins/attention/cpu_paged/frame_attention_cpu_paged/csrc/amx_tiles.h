// Prefill tiles and cascade prefixes of the bfloat16 path on AMX tiles (Sapphire Rapids and later): both products
// of a 32-key step for 16 query rows at a time as tile multiplies, the online softmax between them on vectors.
//
// Why: on such a CPU `vdpbf16ps` issues about once per two cycles (benchmarks/bf16_peak.cpp: 1.8 G/s per core),
// which bound the vector tile path; a tile multiply does 16 x 16 x 32 in about 16 cycles. On 2 cores of a Xeon
// with AMX a 2,000-token prefill's attention went 27 -> 9 ms a layer.
// - Scores: S [16 rows][32 keys] = Q [16 rows][32 dims] . K^T, Q's rows straight from the item's queries and
//   K^T the step's keys transposed to pairs (transpose_keys, the vector tile path's layout: the tiles' too).
// - Values: P [16 rows][32 keys] . V, P the softmax's bfloat16 pairs and V the step's interleaved key pairs
//   (interleave_values, again the tiles' layout); each 16-column slice of the product is stored and added to the
//   rows' float32 accumulators, which the softmax has already rescaled.
// Decode rows stay on vectors: with 1-8 rows a tile would mostly multiply zeros, and the round trips between
// tiles and vectors cost more than they save (tried: a batch-64 decode layer was no faster).
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

// ldtilecfg reads all 64 bytes; GCC 12's `_tile_loadconfig` names only 8 as its operand, so a config built on the
// stack could lose its stores as dead. Naming the whole struct keeps them, whatever the compiler.
inline void load_tile_config(const TileConfig& config) { __asm__ volatile("ldtilecfg %0" ::"m"(config)); }

// This thread's tiles for the scope of one item.
class Tiles {
 public:
  Tiles() {
    static const TileConfig config;
    load_tile_config(config);
  }
  ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

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
