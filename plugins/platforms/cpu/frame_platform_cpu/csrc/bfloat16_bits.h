// bfloat16 values as raw 16-bit patterns, shared by the platform's kernels.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

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

#if defined(__AVX512BF16__)
// Sixteen at a time. The lanes of a row's last, partial vector: `left` values remain.
inline __mmask16 tail_mask16(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// Sixteen bfloat16 as float32, exactly.
inline __m512 widen16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// The lanes of `mask` loaded and widened; the others zero.
inline __m512 load16(const uint16_t* bits, __mmask16 mask) { return widen16(_mm256_maskz_loadu_epi16(mask, bits)); }

// Sixteen float32 rounded to bfloat16 (nearest even).
inline __m256i narrow16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

// float32 -> bfloat16 -> float32.
inline __m512 round_to_bf16(__m512 x) { return widen16(narrow16(x)); }
#endif

}  // namespace frame_cpu
