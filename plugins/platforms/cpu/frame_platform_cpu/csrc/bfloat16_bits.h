// bfloat16 values as raw 16-bit patterns, shared by the platform's kernels.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

namespace frame_cpu {

// Exact: a bfloat16 is the top half of a float32.
inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

// Round to nearest even, as torch does.
inline uint16_t float_to_bf16(float f) { return c10::BFloat16(f).x; }

}  // namespace frame_cpu
