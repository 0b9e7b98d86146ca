// Intel AMX tiles (Sapphire Rapids and later): asking Linux for the tile state, and the one tile configuration the
// platform's AMX kernels share (eight tiles of 16 rows x 64 bytes).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AMX_TILE__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FRAME_AMX 1
#endif

namespace frame_cpu {

#if FRAME_AMX
// Linux hands AMX's 8 KB of tile state to a process only when asked (arch_prctl, kernel 5.16+); without it the
// first tile instruction faults. The permission covers every thread of the process and is asked for once.
inline bool amx_permitted() {
  static const bool permitted = [] {
    constexpr long kReqXcompPerm = 0x1023;
    constexpr long kXfeatureTiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTiledata) == 0;
  }();
  return permitted;
}

// Palette 1, every tile 16 rows x 64 bytes: 16 x 16 float32 / int32 accumulators, 16 rows x 32 bfloat16 (or 64
// int8) of x, 16 pairs (or quads) of inputs x 16 columns of the weight.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  // `x_rows` (1-16): the rows of tiles 0-5 (the accumulators and x); tiles 6 and 7, the weight's, keep 16. Fewer
  // than 16 rows is a few-row product's shape: the tiles load and multiply only the rows there are.
  explicit TileConfig(int x_rows = 16) {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = static_cast<uint8_t>(t < 6 ? x_rows : 16);
    }
  }
};

// ldtilecfg reads all 64 bytes of the config, but GCC 12's `_tile_loadconfig` names only 8 of them as its operand,
// so the stores that build a config on the stack may be dropped as dead (llama.cpp 0.3.36's AMX kernels, built by
// GCC 12, fault that way). Naming the whole struct keeps them.
inline void load_tile_config(const TileConfig& config) { __asm__ volatile("ldtilecfg %0" ::"m"(config)); }

// Configures this thread's tiles for the scope and releases them after, so a thread never keeps AMX state (which
// makes context switches and other code's AVX-512 slower) beyond one kernel call.
class TileScope {
 public:
  TileScope() {
    static const TileConfig config;
    load_tile_config(config);
  }
  explicit TileScope(int x_rows) {
    const TileConfig config(x_rows);
    load_tile_config(config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};
#else
inline bool amx_permitted() { return false; }
#endif

}  // namespace frame_cpu
