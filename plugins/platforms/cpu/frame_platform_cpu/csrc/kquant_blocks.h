// ggml's super-blocks of 256 weights (q4_K, q6_K, q3_K, q2_K, q5_K, iq4_xs) as kquant_linear.cpp reads them, straight
// from the GGUF file's bytes (ggml-common.h's block_q4_K ... block_iq4_xs). Every format becomes, per super-block,
// 256 small integers u (value i at byte i), a float d, 16 integer scales sc (one per 16 values: chunk c = i / 16),
// 16 integer mins mn and a float md, with
//   w_i = d * sc[c] * u_i - md * mn[c]
//   q4_K: u = nibble (0-15), sc and mn = the sub-block's 6-bit scale and min (one per 32), md = dmin
//   q5_K: u = nibble | fifth bit << 4 (0-31), as q4_K
//   q6_K: u = 6 bits (0-63), sc = the int8 scale, mn = 32 sc, md = d       (w = d sc (u - 32))
//   q3_K: u = 2 bits | high bit << 2 (0-7), sc = the 6-bit scale - 32, mn = 4 sc, md = d   (w = d sc (u - 4))
//   q2_K: u = 2 bits (0-3), sc and mn = the 4-bit scale and min (one per 16), md = dmin
//   iq4_xs: u = kvalues_iq4nl[nibble] (int8, signed), sc = the 6-bit scale - 32 (one per 32), no min
// so a super-block's dot with x's int8 values is one integer sum of sc * u * q_x (vpmaddubsw, then vpmaddwd or
// vpdpwssd against the scales), and the mins one against x's sums per 16.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define FRAME_KQUANT_AVX2 1
#endif

namespace kquant_blocks {

enum Format : int64_t { kQ4_K = 0, kQ6_K = 1, kQ3_K = 2, kQ2_K = 3, kQ5_K = 4, kIQ4_XS = 5 };
constexpr int64_t kFormats = 6;
constexpr int64_t kSuper = 256;

constexpr int64_t block_bytes(int64_t format) {
  return format == kQ4_K ? 144 : format == kQ6_K ? 210 : format == kQ3_K ? 110 : format == kQ2_K ? 84
       : format == kQ5_K ? 176 : 136;
}
constexpr bool signed_values(int64_t format) { return format == kIQ4_XS; }

constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

inline uint32_t word_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Formats with one scale (and min) per 32 values, the two chunks of 16 sharing it.
constexpr bool per32(int64_t format) { return format == kQ4_K || format == kQ5_K || format == kIQ4_XS; }
// How mn is formed: -1 from the block's mins, k > 0 as sc << k (q6_K: 32 sc, q3_K: 4 sc), 0 none (iq4_xs).
constexpr int mn_shift(int64_t format) {
  return format == kQ6_K ? 5 : format == kQ3_K ? 2 : format == kIQ4_XS ? 0 : -1;
}

// A super-block's scales: sc (signed) and the mins (unsigned) a byte each, per chunk of 16 or, per32 formats, per
// sub-block of 32 in the first two words; d and md.
struct Header {
  uint32_t sc[4];
  uint32_t mn[4];
  float d, md;
};

// Each byte (0-63) of w less 32, as int8: the high bit set first keeps a byte from borrowing from the next.
inline uint32_t minus32(uint32_t w) { return ((w | 0x80808080u) - 0x20202020u) ^ 0x80808080u; }

template <int64_t Format>
inline Header header(const uint8_t* blk) {
  Header h{};
  if constexpr (Format == kQ4_K || Format == kQ5_K) {
    // ggml's get_scale_min_k4: eight 6-bit scales and mins in 12 bytes.
    constexpr uint32_t six = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const uint32_t a = word_at(blk + 4), b = word_at(blk + 8), c = word_at(blk + 12);
    h.sc[0] = a & six;
    h.sc[1] = (c & low4) | (((a >> 6) & low2) << 4);
    h.mn[0] = b & six;
    h.mn[1] = ((c >> 4) & low4) | (((b >> 6) & low2) << 4);
    h.d = half_at(blk);
    h.md = half_at(blk + 2);
  } else if constexpr (Format == kQ6_K) {
    for (int w = 0; w < 4; ++w) h.sc[w] = word_at(blk + 192 + 4 * w);
    h.d = h.md = half_at(blk + 208);
  } else if constexpr (Format == kQ3_K) {
    // ggml's q3_K scale unpacking: 16 scales of 6 bits, low 4 bits in bytes 0-7, high 2 in bytes 8-11.
    constexpr uint32_t low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const uint32_t a0 = word_at(blk + 96), a1 = word_at(blk + 100), t = word_at(blk + 104);
    h.sc[0] = minus32((a0 & low4) | ((t & low2) << 4));
    h.sc[1] = minus32((a1 & low4) | (((t >> 2) & low2) << 4));
    h.sc[2] = minus32(((a0 >> 4) & low4) | (((t >> 4) & low2) << 4));
    h.sc[3] = minus32(((a1 >> 4) & low4) | (((t >> 6) & low2) << 4));
    h.d = h.md = half_at(blk + 108);
  } else if constexpr (Format == kQ2_K) {
    for (int w = 0; w < 4; ++w) {
      const uint32_t s = word_at(blk + 4 * w);
      h.sc[w] = s & 0x0f0f0f0f;
      h.mn[w] = (s >> 4) & 0x0f0f0f0f;
    }
    h.d = half_at(blk + 80);
    h.md = half_at(blk + 82);
  } else {  // iq4_xs: eight 6-bit scales, low 4 bits as nibbles of bytes 4-7, high 2 in the uint16 at byte 2
    const uint32_t high = blk[2] | (static_cast<uint32_t>(blk[3]) << 8), low = word_at(blk + 4);
    for (int ib = 0; ib < 8; ++ib)
      h.sc[ib / 4] |= (((low >> (4 * ib)) & 0xF) | (((high >> (2 * ib)) & 3) << 4)) << (8 * (ib % 4));
    h.sc[0] = minus32(h.sc[0]);
    h.sc[1] = minus32(h.sc[1]);
    h.d = half_at(blk);
  }
  return h;
}

inline uint8_t byte_of(const uint32_t* words, int i) { return static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4))); }
template <int64_t Format>
inline int32_t sc_of(const Header& h, int c) { return static_cast<int8_t>(byte_of(h.sc, per32(Format) ? c / 2 : c)); }
template <int64_t Format>
inline int32_t mn_of(const Header& h, int c) {
  if constexpr (mn_shift(Format) > 0) return sc_of<Format>(h, c) * (1 << mn_shift(Format));
  return mn_shift(Format) < 0 ? byte_of(h.mn, per32(Format) ? c / 2 : c) : 0;
}

// A super-block's 256 u, plain C++.
template <int64_t Format>
inline void values_portable(const uint8_t* blk, int8_t* u) {
  if constexpr (Format == kQ4_K || Format == kQ5_K) {
    const uint8_t* qs = blk + (Format == kQ5_K ? 48 : 16);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        int lo = qs[32 * j + l] & 0xF, hi = qs[32 * j + l] >> 4;
        if constexpr (Format == kQ5_K) {
          lo |= ((blk[16 + l] >> (2 * j)) & 1) << 4;
          hi |= ((blk[16 + l] >> (2 * j + 1)) & 1) << 4;
        }
        u[64 * j + l] = static_cast<int8_t>(lo);
        u[64 * j + 32 + l] = static_cast<int8_t>(hi);
      }
  } else if constexpr (Format == kQ6_K) {
    for (int n = 0; n < 2; ++n) {
      const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
      for (int l = 0; l < 32; ++l) {
        u[128 * n + l] = static_cast<int8_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4));
        u[128 * n + 32 + l] = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
        u[128 * n + 64 + l] = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        u[128 * n + 96 + l] = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
  } else if constexpr (Format == kQ3_K || Format == kQ2_K) {
    const uint8_t* qs = blk + (Format == kQ3_K ? 32 : 16);
    for (int n = 0; n < 2; ++n)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
          int v = (qs[32 * n + l] >> (2 * j)) & 3;
          if constexpr (Format == kQ3_K) v |= ((blk[l] >> (4 * n + j)) & 1) << 2;
          u[128 * n + 32 * j + l] = static_cast<int8_t>(v);
        }
  } else {
    for (int ib = 0; ib < 8; ++ib)
      for (int l = 0; l < 16; ++l) {
        u[32 * ib + l] = kIQ4NLValues[blk[8 + 16 * ib + l] & 0xF];
        u[32 * ib + 16 + l] = kIQ4NLValues[blk[8 + 16 * ib + l] >> 4];
      }
  }
}

#if FRAME_KQUANT_AVX2
inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// Bits shift..shift+width-1 of each byte of v, at the bottom of the byte (mask = (1 << width) - 1).
inline __m256i bits(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(static_cast<char>(mask)));
}
// Bit `from` of each byte of v, moved to bit `to`.
inline __m256i bit_to(__m256i v, int from, int to) {
  const __m256i moved = from >= to ? _mm256_srli_epi16(v, from - to) : _mm256_slli_epi16(v, to - from);
  return _mm256_and_si256(moved, _mm256_set1_epi8(static_cast<char>(1 << to)));
}

// A super-block's 256 u as 8 vectors of 32 bytes (vector g: values 32g..32g+31).
template <int64_t Format>
inline void values_avx2(const uint8_t* blk, __m256i* u) {
  if constexpr (Format == kQ4_K || Format == kQ5_K) {
    const uint8_t* qs = blk + (Format == kQ5_K ? 48 : 16);
    for (int j = 0; j < 4; ++j) {
      const __m256i q = load32(qs + 32 * j);
      u[2 * j] = bits(q, 0, 0xF);
      u[2 * j + 1] = bits(q, 4, 0xF);
    }
    if constexpr (Format == kQ5_K) {
      const __m256i qh = load32(blk + 16);
      for (int g = 0; g < 8; ++g) u[g] = _mm256_or_si256(u[g], bit_to(qh, g, 4));
    }
  } else if constexpr (Format == kQ6_K) {
    for (int n = 0; n < 2; ++n) {
      const __m256i l0 = load32(blk + 64 * n), l1 = load32(blk + 64 * n + 32), qh = load32(blk + 128 + 32 * n);
      const __m256i top = _mm256_set1_epi8(0x30);
      u[4 * n] = _mm256_or_si256(bits(l0, 0, 0xF), _mm256_and_si256(_mm256_slli_epi16(qh, 4), top));
      u[4 * n + 1] = _mm256_or_si256(bits(l1, 0, 0xF), _mm256_and_si256(_mm256_slli_epi16(qh, 2), top));
      u[4 * n + 2] = _mm256_or_si256(bits(l0, 4, 0xF), _mm256_and_si256(qh, top));
      u[4 * n + 3] = _mm256_or_si256(bits(l1, 4, 0xF), _mm256_and_si256(_mm256_srli_epi16(qh, 2), top));
    }
  } else if constexpr (Format == kQ3_K || Format == kQ2_K) {
    const uint8_t* qs = blk + (Format == kQ3_K ? 32 : 16);
    for (int n = 0; n < 2; ++n) {
      const __m256i q = load32(qs + 32 * n);
      for (int j = 0; j < 4; ++j) u[4 * n + j] = bits(q, 2 * j, 3);
    }
    if constexpr (Format == kQ3_K) {
      const __m256i hm = load32(blk);
      for (int g = 0; g < 8; ++g) u[g] = _mm256_or_si256(u[g], bit_to(hm, g, 2));
    }
  } else {
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
    const __m256i table2 = _mm256_set_m128i(table, table);
    for (int ib = 0; ib < 8; ++ib) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 8 + 16 * ib));
      const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
      u[ib] = _mm256_shuffle_epi8(table2, nib);
    }
  }
}

inline __m128i words128(const uint32_t* w) {
  return _mm_set_epi32(static_cast<int>(w[3]), static_cast<int>(w[2]), static_cast<int>(w[1]), static_cast<int>(w[0]));
}
// Bytes a chunk of 16 (chunk c at byte c) from Header words: per32 formats' bytes doubled.
template <int64_t Format>
inline __m128i chunk_bytes(const uint32_t* w) {
  if constexpr (per32(Format)) {
    const __m128i v = _mm_cvtsi64_si128(static_cast<int64_t>(w[0] | (static_cast<uint64_t>(w[1]) << 32)));
    return _mm_shuffle_epi8(v, _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0));
  }
  return words128(w);
}
// mn as 16 int16 lanes (chunk c in lane c).
template <int64_t Format>
inline __m256i mins16(const Header& h) {
  if constexpr (mn_shift(Format) > 0)
    return _mm256_slli_epi16(_mm256_cvtepi8_epi16(chunk_bytes<Format>(h.sc)), mn_shift(Format));
  return _mm256_cvtepu8_epi16(chunk_bytes<Format>(h.mn));
}
#endif

// Calls f(std::integral_constant<int64_t, format>) for a runtime format (one instance of a kernel per format).
template <typename F>
inline void with_format(int64_t format, F&& f) {
  switch (format) {
    case kQ4_K: f(std::integral_constant<int64_t, kQ4_K>{}); break;
    case kQ6_K: f(std::integral_constant<int64_t, kQ6_K>{}); break;
    case kQ3_K: f(std::integral_constant<int64_t, kQ3_K>{}); break;
    case kQ2_K: f(std::integral_constant<int64_t, kQ2_K>{}); break;
    case kQ5_K: f(std::integral_constant<int64_t, kQ5_K>{}); break;
    default: f(std::integral_constant<int64_t, kIQ4_XS>{}); break;
  }
}

}  // namespace kquant_blocks
