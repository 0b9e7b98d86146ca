// Element conversions of the float path: cache and query values to float32 (an fp8 code by its table) and results
// back to the query's dtype. Used by the per-item driver, the KV writes and the quantized pool's widening.
#pragma once

#include "common.h"

namespace frame_cpu_paged {

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

}  // namespace frame_cpu_paged
