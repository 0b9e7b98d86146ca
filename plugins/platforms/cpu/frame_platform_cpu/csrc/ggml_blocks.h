// ggml's blocks of 32 weights as ggml_linear.cpp reads them: the formats, their sizes, and one block's values as
// integers for each ISA path (plain C++, AVX2, and AVX-512 VNNI over the repacked layout of
// repack.repack_blocks). Every path turns a block into 32 integers u and a float rule:
//   q4_0:   u = nibble (0-15)                       w = d (u - 8)
//   q4_1:   u = nibble                              w = d u + m
//   q8_0:   u = the int8 q                          w = d u
//   q5_0:   u = nibble | high bit << 4 (0-31)       w = d (u - 16)
//   q5_1:   u = nibble | high bit << 4              w = d u + m
//   iq4_nl: u = kvalues_iq4nl[nibble] (int8)        w = d u
// so one integer dot product per block against x's int8 values, and the offset and m against x's block sum.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define FRAME_GGML_AVX2 1
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define FRAME_GGML_VNNI 1
#endif

namespace ggml_blocks {

enum Format : int64_t {
  kQ4_0 = 0, kQ4_1 = 1, kQ8_0 = 2, kQ5_0 = 3, kQ5_1 = 4, kIQ4_NL = 5,
  kQ4_K = 6, kQ6_K = 7, kQ5_K = 8, kQ3_K = 9, kQ2_K = 10, kIQ4_XS = 11
};
// Formats of ggml's own blocks (ggml_linear reads them as the file stores them). The K-quants (super-blocks of
// 256) are read only repacked, each chunk of 32 as a block: q4_K's and q5_K's w = d sc q - dmin mn with q of 4 or 5
// bits and a 6-bit sc and mn per chunk; q6_K's w = d sc (q - 32) with q of 6 bits and an int8 sc per 16, q3_K's
// w = d sc (q - 4) with q of 3 bits and sc so; q2_K's w = d sc q - dmin mn with q of 2 bits and a 4-bit sc and mn
// per 16; iq4_xs's w = d sc kvalues_iq4nl[q] with an int8 sc per chunk. Each super-block is summed as integers and
// scaled once, as ggml's own dot products do.
constexpr int64_t kFormats = 6;
constexpr int64_t kRepackedFormats = 12;
constexpr bool super_block(int64_t format) {
  return format == kQ4_K || format == kQ5_K || format == kQ6_K || format == kQ3_K || format == kQ2_K ||
         format == kIQ4_XS;
}
// The super-block formats with a min per chunk (q4_K, q5_K): the same record of scales.
constexpr bool chunk_mins(int64_t format) { return format == kQ4_K || format == kQ5_K; }
// The super-block formats with an int8 scale per 16 inputs and an offset instead of a min (q6_K: u - 32, q3_K:
// u - 4): the same record of scales, and the same sums.
constexpr bool scales_per_16(int64_t format) { return format == kQ6_K || format == kQ3_K; }
constexpr int32_t offset_per_16(int64_t format) { return format == kQ6_K ? 32 : format == kQ3_K ? 4 : 0; }
// The super-block formats whose sums take x's sums per 16 inputs (the offsets above, q2_K's mins per 16).
constexpr bool sums_per_16(int64_t format) { return scales_per_16(format) || format == kQ2_K; }
// The repacked layout's 64-byte chunks per group and block, and its rows of 16 float16 per group and scale record
// (a block's d, and m; or a super-block's record: q4_K's and q5_K's sc, mn, d and dmin, q6_K's and q3_K's sc and d).
constexpr int quads_for(int64_t format) {
  return format == kQ8_0 ? 8 : format == kQ6_K ? 6 : format == kQ3_K ? 3 : format == kQ2_K ? 2
       : (format == kQ5_0 || format == kQ5_1 || format == kQ5_K ? 5 : 4);
}

constexpr int64_t block_bytes(int64_t format) {
  return format == kQ8_0 ? 34 : format == kQ4_1 ? 20 : format == kQ5_0 ? 22 : format == kQ5_1 ? 24 : 18;
}
// Blocks with an m (w = d u + m): its float16 follows d.
constexpr bool has_min(int64_t format) { return format == kQ4_1 || format == kQ5_1 || chunk_mins(format); }
constexpr int scale_rows_for(int64_t format) {
  return chunk_mins(format) || format == kQ2_K ? 10 : scales_per_16(format) ? 9 : format == kIQ4_XS ? 5
       : has_min(format) ? 2 : 1;
}
// Blocks whose u are int8 (signed) rather than unsigned.
constexpr bool signed_values(int64_t format) { return format == kQ8_0 || format == kIQ4_NL || format == kIQ4_XS; }
// The offset an unsigned u carries: w = d (u - offset) (+ m).
constexpr int32_t offset_of(int64_t format) { return format == kQ4_0 ? 8 : format == kQ5_0 ? 16 : 0; }
// Where the 5-bit formats keep their 32 high bits (a little-endian uint32) and where the values start.
constexpr int64_t high_bits_at(int64_t format) { return has_min(format) ? 4 : 2; }
constexpr int64_t values_at(int64_t format) {
  return format == kQ5_0 || format == kQ5_1 ? high_bits_at(format) + 4 : high_bits_at(format);
}

// llama.cpp's kvalues_iq4nl: iq4_nl's 16 levels (ggml-common.h).
constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// A block's 32 u, plain C++.
inline void values_portable(int64_t format, const uint8_t* blk, int32_t* u) {
  const uint8_t* qs = blk + values_at(format);
  if (format == kQ8_0) {
    for (int i = 0; i < 32; ++i) u[i] = static_cast<int8_t>(qs[i]);
    return;
  }
  for (int i = 0; i < 16; ++i) {
    u[i] = qs[i] & 0x0F;
    u[i + 16] = qs[i] >> 4;
  }
  if (format == kIQ4_NL) {
    for (int i = 0; i < 32; ++i) u[i] = kIQ4NLValues[u[i]];
  } else if (format == kQ5_0 || format == kQ5_1) {
    uint32_t high;
    std::memcpy(&high, blk + high_bits_at(format), sizeof high);
    for (int i = 0; i < 32; ++i) u[i] |= static_cast<int32_t>((high >> i) & 1) << 4;
  }
}

#if FRAME_GGML_AVX2
// 32 bits as 32 bytes, 0xFF where the bit is set (llama.cpp's bytes_from_bits_32): byte i is bit i.
inline __m256i bytes_from_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, sizeof bits);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1));
}

// A block's 32 u as bytes (signed for q8_0 and iq4_nl, unsigned otherwise).
template <int64_t Format>
inline __m256i values_avx2(const uint8_t* blk) {
  const uint8_t* qs = blk + values_at(Format);
  if constexpr (Format == kQ8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
  if constexpr (Format == kIQ4_NL) {
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
    u = _mm256_shuffle_epi8(_mm256_set_m128i(table, table), u);
  }
  if constexpr (Format == kQ5_0 || Format == kQ5_1)
    u = _mm256_or_si256(u, _mm256_and_si256(bytes_from_bits(blk + high_bits_at(Format)), _mm256_set1_epi8(0x10)));
  return u;
}
#endif

#if FRAME_GGML_VNNI
// The repacked layout's chunks of 64 bytes per group of 16 rows and block: 4 of nibbles (q4_0, q4_1, iq4_nl), those
// 4 and one of high-bit masks (q5_0, q5_1), or 8 of bytes (q8_0).
template <int64_t Format>
constexpr int quads_of() { return quads_for(Format); }
// vpdpbusd's weight operand is unsigned: w = d (v - offset) (+ m) for the bytes v the repacked layout yields.
template <int64_t Format>
constexpr int32_t vnni_offset_of() { return signed_values(Format) ? 128 : offset_of(Format); }

// iq4_nl's levels plus 128, as vpshufb's table in each 128-bit lane.
inline __m512i iq4nl_unsigned_table() {
  alignas(16) uint8_t table[16];
  for (int i = 0; i < 16; ++i) table[i] = static_cast<uint8_t>(kIQ4NLValues[i] + 128);
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(table)));
}

// w[i]: the 16 rows' unsigned values of inputs 4i..4i+3 (lane j, byte t: row j's input 4i + t), from one group's
// block in the repacked layout. The q5 formats' fifth chunk holds 8 masks of 64 bits, mask i's bit 4j + t set
// where row j's input 4i + t has its high bit; q6_K's fifth and sixth chunks its values' bits 4 and 5 so. q3_K's
// first two chunks hold its values' two low bits, four to a byte (chunk c's bits 2p..2p+1 are w[4c + p]'s), and its
// third chunk the masks of bit 2; q2_K's two chunks its values so.
template <int64_t Format>
inline void values_vnni(const uint8_t* wb, __m512i* w) {
  if constexpr (Format == kQ8_0) {
    for (int i = 0; i < 8; ++i) w[i] = _mm512_loadu_si512(wb + 64 * i);
    return;
  }
  if constexpr (Format == kQ3_K || Format == kQ2_K) {
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    for (int c = 0; c < 2; ++c) {
      const __m512i packed = _mm512_loadu_si512(wb + 64 * c);
      w[4 * c] = _mm512_and_si512(packed, three);
      for (int p = 1; p < 4; ++p) w[4 * c + p] = _mm512_and_si512(_mm512_srli_epi16(packed, 2 * p), three);
    }
    for (int i = 0; Format == kQ3_K && i < 8; ++i) {
      __mmask64 high;
      std::memcpy(&high, wb + 128 + 8 * i, sizeof high);
      w[i] = _mm512_mask_add_epi8(w[i], high, w[i], four);
    }
    return;
  }
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {
    const __m512i packed = _mm512_loadu_si512(wb + 64 * c);
    w[c] = _mm512_and_si512(packed, nibble);
    w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
  }
  if constexpr (Format == kIQ4_NL || Format == kIQ4_XS) {
    const __m512i table = iq4nl_unsigned_table();
    for (int i = 0; i < 8; ++i) w[i] = _mm512_shuffle_epi8(table, w[i]);
  }
  if constexpr (Format == kQ5_0 || Format == kQ5_1 || Format == kQ5_K || Format == kQ6_K) {
    const __m512i sixteen = _mm512_set1_epi8(0x10);
    for (int i = 0; i < 8; ++i) {
      __mmask64 high;
      std::memcpy(&high, wb + 256 + 8 * i, sizeof high);
      w[i] = _mm512_mask_add_epi8(w[i], high, w[i], sixteen);
    }
  }
  if constexpr (Format == kQ6_K) {
    const __m512i thirty_two = _mm512_set1_epi8(0x20);
    for (int i = 0; i < 8; ++i) {
      __mmask64 high;
      std::memcpy(&high, wb + 320 + 8 * i, sizeof high);
      w[i] = _mm512_mask_add_epi8(w[i], high, w[i], thirty_two);
    }
  }
}
#endif

#if FRAME_GGML_VNNI
// with_format for the repacked layout read with AVX-512 VNNI, which also holds q4_K.
template <typename F>
inline void with_repacked_format(int64_t format, F&& f);
#endif

// Calls f(std::integral_constant<int64_t, format>) for a runtime format (one instance of a kernel per format).
template <typename F>
inline void with_format(int64_t format, F&& f) {
  switch (format) {
    case kQ4_0: f(std::integral_constant<int64_t, kQ4_0>{}); break;
    case kQ4_1: f(std::integral_constant<int64_t, kQ4_1>{}); break;
    case kQ8_0: f(std::integral_constant<int64_t, kQ8_0>{}); break;
    case kQ5_0: f(std::integral_constant<int64_t, kQ5_0>{}); break;
    case kQ5_1: f(std::integral_constant<int64_t, kQ5_1>{}); break;
    default: f(std::integral_constant<int64_t, kIQ4_NL>{}); break;
  }
}

#if FRAME_GGML_VNNI
template <typename F>
inline void with_repacked_format(int64_t format, F&& f) {
  if (format == kQ4_K) return f(std::integral_constant<int64_t, kQ4_K>{});
  if (format == kQ6_K) return f(std::integral_constant<int64_t, kQ6_K>{});
  if (format == kQ5_K) return f(std::integral_constant<int64_t, kQ5_K>{});
  if (format == kQ3_K) return f(std::integral_constant<int64_t, kQ3_K>{});
  if (format == kQ2_K) return f(std::integral_constant<int64_t, kQ2_K>{});
  if (format == kIQ4_XS) return f(std::integral_constant<int64_t, kIQ4_XS>{});
  with_format(format, std::forward<F>(f));
}
#endif

}  // namespace ggml_blocks
