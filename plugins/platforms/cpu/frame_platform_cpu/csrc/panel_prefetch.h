// Asking for a linear's next weight panel while the current one is multiplied, shared by the packed bfloat16
// linear and the W8A8 one, whose row tiles walk a thread's panels in the same way.
//
// The first row tile streams a panel from memory at its own pace and the others reread it from cache, so the
// later tiles ask for the thread's next panel a share each: a step's bfloat16 decode linears at 64 rows with the
// weights from memory went from about 80% of their in-cache rate to 95% (25.6 -> 20.7 ms on Zen 5). A single tile
// of 8 rows or more asks for it itself; fewer rows are bound by the weight's bytes, where the hardware prefetcher
// keeps up.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace frame_cpu {

// Lines [first, first + count) of the next panel for row tile `tile` of `tiles` (whose rows number `rows`).
struct PrefetchShare {
  int64_t first = 0, count = 0;
};

inline PrefetchShare prefetch_share(int64_t next_lines, int64_t rows, int64_t tiles, int64_t tile) {
  if (rows < 8 || next_lines == 0) return {};
  const int64_t first_tile = tiles > 1 ? 1 : 0, sharing = tiles - first_tile;
  if (tile < first_tile) return {};
  const int64_t first = next_lines * (tile - first_tile) / sharing;
  return {first, next_lines * (tile - first_tile + 1) / sharing - first};
}

// step(0) ... step(steps - 1), with `lines` 64-byte lines from `ahead` asked into L1 evenly along the way.
template <typename Step>
__attribute__((always_inline)) inline void steps_with_prefetch(int64_t steps, const char* ahead, int64_t lines,
                                                               Step&& step) {
  int64_t s = 0;
  if (lines > 0) {
    const int64_t every = std::max<int64_t>(1, steps / lines);
    for (const char* line = ahead; s + every <= steps && line < ahead + 64 * lines; line += 64) {
      _mm_prefetch(line, _MM_HINT_T0);
      for (int64_t i = 0; i < every; ++i, ++s) step(s);
    }
  }
  for (; s < steps; ++s) step(s);
}

}  // namespace frame_cpu
