// bfloat16 values as raw 16-bit patterns, shared by the platform's kernels.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

// The sixteen-lane helpers need AVX-512 F, BW and VL (every AVX-512 server CPU since Skylake-SP has them); only
// the rounding uses AVX-512 BF16, and has an integer version for CPUs without it (Ice Lake, Cascade Lake).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define FRAME_AVX512_BF16_BITS 1
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

#if FRAME_AVX512_BF16_BITS
// Sixteen at a time. The lanes of a row's last, partial vector: `left` values remain.
inline __mmask16 tail_mask16(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// Sixteen bfloat16 as float32, exactly.
inline __m512 widen16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// The lanes of `mask` loaded and widened; the others zero.
inline __m512 load16(const uint16_t* bits, __mmask16 mask) { return widen16(_mm256_maskz_loadu_epi16(mask, bits)); }

// Sixteen float32 rounded to bfloat16 (nearest even).
#if defined(__AVX512BF16__)
inline __m256i narrow16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
#else
// torch's rounding in integer lanes: add 0x7FFF plus the kept part's lowest bit, keep the top half; NaN becomes
// 0x7FC0. (vcvtneps2bf16 flushes denormal inputs to zero where this keeps them, as torch does.)
inline __m256i narrow16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i top = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  top = _mm512_mask_mov_epi32(top, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(top);
}
#endif

// float32 -> bfloat16 -> float32.
inline __m512 round_to_bf16(__m512 x) { return widen16(narrow16(x)); }
#endif

}  // namespace frame_cpu
