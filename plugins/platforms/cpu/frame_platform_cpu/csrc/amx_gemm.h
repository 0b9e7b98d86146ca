// The loop every AMX linear of the platform shares: x [m, k] (row-major) against a weight packed as panels of 32
// output columns in the tiles' own layout (for each group of `pack` consecutive inputs, the panel's 32 columns'
// values side by side: [n / 32][k / pack][32][pack], pack 2 for bfloat16 and 4 for int8, so every row of a weight
// tile is 64 bytes of 16 columns), into 32 x 32 blocks of 32-bit accumulators that an epilogue turns into y.
//
// A block keeps four 16 x 16 accumulator tiles (0-3) over the whole of k, loading two tiles of x (4, 5) and two of
// the weight (6, 7) per 64 bytes of inputs. A thread takes its panels in groups of equal size of at most 1 MB,
// which stay in L2 while every block of rows passes over them; a block's x stays in L1 across the group. Each group
// reads all of x again (from memory past about 2,000 rows), so fewer, even groups pay: 512 KB groups had split a
// thread's 15 QKV panels 14 + 1. 1 MB even groups: a 4,096-row QKV 1.23x faster, gate-up 1.04x, down 1.08x.
// Each block's epilogue runs after the next block's tile instructions are issued, so the vector code overlaps the
// tiles' work (that alone took the bfloat16 gate-up shape from 1.0-1.2 to 1.6-1.9 TFLOP/s on 2 cores). The last,
// partial block of rows is copied into a zero-padded buffer, so every tile is whole. Every row runs the same
// instructions in the same order whatever the number of rows (fewer than 16 run on tiles of that many rows, see
// product) and whatever the grouping, so a row's result does not depend on its batch.
#pragma once

#include "amx_tiles.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if FRAME_AMX
namespace frame_cpu::amx {

constexpr int64_t kPanel = 32;              // output columns per packed panel
constexpr int64_t kBlockRows = 32;          // rows per block: two tiles of x
constexpr int64_t kGroupBytes = 1 << 20;    // weight bytes of the panels a thread keeps in L2 (of 2 MB) at once

enum class Dot { kBf16, kInt8 };  // tdpbf16ps (float32 sums) or tdpbssd (signed int8, int32 sums)

// One block: Rows x 16 tiles of rows of x (row stride x_stride bytes, k_bytes of inputs per row) against Cols
// tiles of a panel, stored into c [32][32] 32-bit accumulators.
template <Dot D, int Rows, int Cols>
void block(const uint8_t* x, int64_t x_stride, int64_t k_bytes, const uint8_t* panel, void* c) {
  constexpr int64_t w_stride = Cols * 64;  // bytes from one input group to the next in the panel
  _tile_zero(0);
  if constexpr (Cols == 2) _tile_zero(1);
  if constexpr (Rows == 2) _tile_zero(2);
  if constexpr (Rows == 2 && Cols == 2) _tile_zero(3);
  for (int64_t kb = 0; kb < k_bytes; kb += 64) {
    const uint8_t* w = panel + kb * 16 * Cols;  // 16 input groups of Cols x 64 bytes per 64 bytes of x
    _tile_loadd(6, w, w_stride);
    if constexpr (Cols == 2) _tile_loadd(7, w + 64, w_stride);
    _tile_loadd(4, x + kb, x_stride);
    if constexpr (D == Dot::kBf16) {
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (Cols == 2) _tile_dpbf16ps(1, 4, 7);
    } else {
      _tile_dpbssd(0, 4, 6);
      if constexpr (Cols == 2) _tile_dpbssd(1, 4, 7);
    }
    if constexpr (Rows == 2) {
      _tile_loadd(5, x + 16 * x_stride + kb, x_stride);
      if constexpr (D == Dot::kBf16) {
        _tile_dpbf16ps(2, 5, 6);
        if constexpr (Cols == 2) _tile_dpbf16ps(3, 5, 7);
      } else {
        _tile_dpbssd(2, 5, 6);
        if constexpr (Cols == 2) _tile_dpbssd(3, 5, 7);
      }
    }
  }
  auto* out = static_cast<uint8_t*>(c);
  constexpr int64_t c_stride = kPanel * 4;
  _tile_stored(0, out, c_stride);
  if constexpr (Cols == 2) _tile_stored(1, out + 64, c_stride);
  if constexpr (Rows == 2) _tile_stored(2, out + 16 * c_stride, c_stride);
  if constexpr (Rows == 2 && Cols == 2) _tile_stored(3, out + 16 * c_stride + 64, c_stride);
}

template <Dot D>
void run_block(int64_t rows, int cols, const uint8_t* x, int64_t x_stride, int64_t k_bytes, const uint8_t* panel,
               void* c) {
  if (cols == 2) {
    rows > 16 ? block<D, 2, 2>(x, x_stride, k_bytes, panel, c) : block<D, 1, 2>(x, x_stride, k_bytes, panel, c);
  } else {
    rows > 16 ? block<D, 2, 1>(x, x_stride, k_bytes, panel, c) : block<D, 1, 1>(x, x_stride, k_bytes, panel, c);
  }
}

// x [m rows of k_bytes] against the n-column packed weight `wp`. For each block, once its accumulators are in
// memory, `epilogue(c, rows, cols, row, panel)` writes y's rows [row, row + rows) of panel `panel` (cols: 2 for
// 32 columns, 1 for a last panel of 16); c is [32][32] float32 or int32.
//
// Fewer than 16 rows (a decode step's few rows) run on tiles configured with that many rows (TileConfig): x's
// tile is loaded from x itself, and the tiles multiply m rows instead of a zero-padded 16. Each row's sums are
// the same instructions in the same order as in a 16-row tile, so its result is bitwise the same.
template <Dot D, typename Epilogue>
void product(const uint8_t* xp, int64_t m, int64_t k_bytes, const uint8_t* wp, int64_t n, Epilogue epilogue) {
  const bool few = m < 16;
  const int64_t whole = few ? m : m / kBlockRows * kBlockRows;
  std::vector<uint8_t> tail;  // the last block's rows, zero-padded to whole tiles
  if (whole < m) {
    tail.assign(kBlockRows * k_bytes, 0);
    std::memcpy(tail.data(), xp + whole * k_bytes, (m - whole) * k_bytes);
  }
  const int64_t panels = (n + kPanel - 1) / kPanel;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    TileScope tiles(few ? static_cast<int>(m) : 16);
    alignas(64) int32_t c[2][kBlockRows * kPanel];
    struct Pending {
      const int32_t* c;
      int64_t rows, row, panel;
      int cols;
    };
    Pending pending{nullptr, 0, 0, 0, 0};
    int which = 0;
    auto finish = [&]() {
      if (pending.c != nullptr) epilogue(pending.c, pending.rows, pending.cols, pending.row, pending.panel);
      pending.c = nullptr;
    };
    auto one = [&](int64_t p, int64_t r) {
      const int64_t col = p * kPanel;
      const int cols = n - col >= kPanel ? 2 : 1;
      const int64_t rows = std::min(kBlockRows, m - r);
      run_block<D>(rows, cols, r < whole ? xp + r * k_bytes : tail.data(), k_bytes, k_bytes, wp + col * k_bytes,
                   c[which]);
      finish();
      pending = {c[which], rows, r, p, cols};
      which ^= 1;
    };
    const int64_t most = std::max<int64_t>(1, kGroupBytes / (kPanel * k_bytes));
    const int64_t groups = (end - begin + most - 1) / most;
    const int64_t group = (end - begin + groups - 1) / groups;
    for (int64_t g = begin; g < end; g += group) {
      const int64_t g_end = std::min(end, g + group);
      for (int64_t r = 0; r < m; r += kBlockRows)
        for (int64_t p = g; p < g_end; ++p) one(p, r);
    }
    finish();
  });
}

}  // namespace frame_cpu::amx
#endif
