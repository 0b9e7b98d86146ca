// The repacked ggml layout (repack.repack_blocks) read with AVX2: the path of CPUs with AVX2 and no AVX-512 VNNI
// (Zen 2 / Zen 3, Haswell to Comet Lake). A group's chunk [16 rows][4 bytes] is two ymm halves, rows 0-7 and 8-15,
// one row per int32 lane; `vpmaddubsw` of a half against x's 4 inputs broadcast and `vpmaddwd` by ones leave each
// row's sum of those 4 products in its own lane, so a block's 8 rows need no horizontal sum, and the scales of 8
// rows scale 8 lanes at once. ggml's own layout (ggml_linear.cpp's rows_avx2) sums one row a block into 8 lanes and
// scales them with one broadcast: at one row of x on a Zen 4 with AVX-512 disabled it read SmolLM2's q4_1 linears
// at 21.5 GB/s, where this layout streams at the machine's rate (docs/performance-changes.md).
//
// Exact integer sums, as every path: vpmaddubsw's 16-bit pairs are added in 16 bits while they cannot overflow
// (x's int8 values lie in [-127, 127]: a q4 pair is at most 2 * 15 * 127, eight of them 30480; a q5 pair 2 * 31 *
// 127, four of them 31496), then widened. q8_0 and iq4_nl hold signed values: their sign moves onto x
// (`vpsignb`) and each pair, at most 2 * 128 * 127, is widened at once.
#pragma once

#include <algorithm>

#include "ggml_blocks.h"

#if FRAME_GGML_AVX2
namespace ggml_blocks {

// The value chunks of a repacked block, and those of its format that may be summed in 16 bits before widening.
template <int64_t Format>
constexpr int repacked_chunks() { return Format == kQ8_0 ? 8 : (Format == kQ5_0 || Format == kQ5_1 ? 5 : 4); }
template <int64_t Format>
constexpr int pairs_in_16_bits() {
  return signed_values(Format) ? 1 : (Format == kQ5_0 || Format == kQ5_1 ? 4 : 8);
}

// Half `h` (rows 8h..8h+7) of a repacked block `wb` as 8 vectors: w[i] holds each row's 4 values of inputs
// 4i..4i+3 (unsigned for the nibble formats, signed for q8_0 and iq4_nl).
template <int64_t Format>
inline void unpack_half(const uint8_t* wb, int h, __m256i* w) {
  const auto chunk = [&](int c) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * c + 32 * h)); };
  if constexpr (Format == kQ8_0) {
    for (int c = 0; c < 8; ++c) w[c] = _mm256_xor_si256(chunk(c), _mm256_set1_epi8(static_cast<char>(0x80)));
    return;
  }
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {  // byte t of chunk c: input 4c + t in its low nibble, 16 + 4c + t in its high one
    const __m256i packed = chunk(c);
    w[c] = _mm256_and_si256(packed, low);
    w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
  }
  if constexpr (Format == kIQ4_NL) {
    const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
    const __m256i table = _mm256_set_m128i(levels, levels);
    for (int i = 0; i < 8; ++i) w[i] = _mm256_shuffle_epi8(table, w[i]);
  }
  if constexpr (Format == kQ5_0 || Format == kQ5_1) {
    // The fifth chunk: 8 64-bit masks, mask i's bit 4j + t the high bit of row j's input 4i + t; this half's rows
    // are its upper or lower 32 bits, one bit per byte of w[i].
    const __m256i fifth = _mm256_set1_epi8(0x10);
    for (int i = 0; i < 8; ++i) w[i] = _mm256_or_si256(w[i], _mm256_and_si256(bytes_from_bits(wb + 256 + 8 * i + 4 * h), fifth));
  }
}

// The 8 rows' exact integer dots of unpacked values `w` with x's 32 int8 values `xb`, plus `start`.
template <int64_t Format>
inline __m256i half_dot(const __m256i* w, const int8_t* xb, __m256i start) {
  constexpr int per16 = pairs_in_16_bits<Format>();
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i total = start, pairs = _mm256_setzero_si256();
  for (int i = 0; i < 8; ++i) {
    int32_t quad;
    std::memcpy(&quad, xb + 4 * i, sizeof quad);
    const __m256i x = _mm256_set1_epi32(quad);
    const __m256i product = signed_values(Format) ? _mm256_maddubs_epi16(_mm256_sign_epi8(w[i], w[i]),
                                                                         _mm256_sign_epi8(x, w[i]))
                                                  : _mm256_maddubs_epi16(w[i], x);
    pairs = per16 == 1 ? product : _mm256_add_epi16(pairs, product);
    if ((i + 1) % per16 == 0) {
      total = _mm256_add_epi32(total, _mm256_madd_epi16(pairs, ones));
      pairs = _mm256_setzero_si256();
    }
  }
  return total;
}

// A block's float16 scales of half h: 8 rows' d (`which` 0) or m (1) as float32.
inline __m256 half_scales(const uint16_t* sb, int which, int h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 16 * which + 8 * h)));
}

// G groups of 16 output rows side by side in a set's block rows (the first at qs and scales, its blocks `qstride`
// bytes and scales `sstride` values apart, each group's scales `svalues` after the last's) against R rows of x
// (int8 q [R][k], per block d, s and sum [R][nb]): acc[2 (R g + r) + h] lane j = group g's row 8h + j's dot with
// x's row r. G = 1 reads one group's blocks a block row apart; a whole set reads as one stream, `ahead` bytes ahead:
// a lone row group by group read 45-48% of a core's floor on a Zen 5 running this path, against 60-67% for the
// same groups stored one after another, and 2-4 rows lost as much. The same operations either way, so the bits.
template <int64_t Format, int R, int G = 1>
void group_avx2(const uint8_t* qs, int64_t qstride, const uint16_t* scales, int64_t sstride, int64_t nb,
                const int8_t* qx, const float* dx, const float* sx, const int32_t* sumx, int64_t k, __m256* acc,
                int64_t svalues = 0, int64_t ahead = 0) {
  constexpr int64_t qbytes = repacked_chunks<Format>() * 64;
  constexpr int32_t offset = offset_of(Format);
  // About 1 KB of a group's own blocks ahead, or `ahead` bytes of a set's rows.
  const int64_t blocks_ahead = G == 1 ? std::max<int64_t>(1, 1024 / qbytes) : (ahead + qstride - 1) / qstride;
  for (int i = 0; i < 2 * R * G; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* row = qs + b * qstride;
    for (int64_t c = 0; c < G * qbytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row + blocks_ahead * qstride + c), _MM_HINT_T0);
    const uint16_t* srow = scales + b * sstride;
    for (int64_t c = 0; c < (G == 1 ? 1 : G * svalues * 2); c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(srow + blocks_ahead * sstride) + c, _MM_HINT_T0);
#pragma GCC unroll 1
    for (int g = 0; g < G; ++g) {
      const uint8_t* wb = row + g * qbytes;
      const uint16_t* sb = srow + g * svalues;
      for (int h = 0; h < 2; ++h) {
        __m256i w[8];
        unpack_half<Format>(wb, h, w);
        const __m256 dw = half_scales(sb, 0, h);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const int64_t at = r * nb + b;
          const __m256i start = offset ? _mm256_set1_epi32(-offset * sumx[at]) : _mm256_setzero_si256();
          const __m256i dot = half_dot<Format>(w, qx + r * k + b * 32, start);
          __m256& a = acc[2 * (R * g + r) + h];
          a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dx[at])), dw, a);
          if constexpr (has_min(Format)) a = _mm256_fmadd_ps(half_scales(sb, 1, h), _mm256_set1_ps(sx[at]), a);
        }
      }
    }
  }
}

}  // namespace ggml_blocks
#endif
