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

// A super-block's scales: sc and mn as 16 bytes each (chunk c at byte c; sc signed, mn unsigned but for the
// offset formats, whose mn = offset * sc is formed from sc by the caller), and d, md.
struct Header {
  uint32_t sc[4];
  uint32_t mn[4];
  float d, md;
  int mn_shift;  // q6_K / q3_K: mn = sc << mn_shift (32 sc, 4 sc); -1: mn holds the mins; 0 unused
};

// q4_K / q5_K's twelve bytes of eight 6-bit scales and mins (ggml's get_scale_min_k4), in words: scales 0-3, 4-7,
// mins 0-3, 4-7 a byte each.
inline void k4_scales(const uint8_t* p, uint32_t out[4]) {
  constexpr uint32_t six = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
  const uint32_t a = word_at(p), b = word_at(p + 4), c = word_at(p + 8);
  out[0] = a & six;
  out[1] = (c & low4) | (((a >> 6) & low2) << 4);
  out[2] = b & six;
  out[3] = ((c >> 4) & low4) | (((b >> 6) & low2) << 4);
}

// Byte i of the 8 bytes in words lo, hi twice over: chunk c's value is sub-block c / 2's.
inline void spread_pairs(uint32_t lo, uint32_t hi, uint32_t out[4]) {
  const uint64_t v = lo | (static_cast<uint64_t>(hi) << 32);
  for (int w = 0; w < 4; ++w) {
    uint32_t word = 0;
    for (int t = 0; t < 4; ++t) word |= static_cast<uint32_t>((v >> (8 * ((4 * w + t) / 2))) & 0xFF) << (8 * t);
    out[w] = word;
  }
}

// Each byte (0-63) of w less 32, as int8: the high bit set first keeps a byte from borrowing from the next.
inline uint32_t minus32(uint32_t w) { return ((w | 0x80808080u) - 0x20202020u) ^ 0x80808080u; }

template <int64_t Format>
inline Header header(const uint8_t* blk) {
  Header h{};
  if constexpr (Format == kQ4_K || Format == kQ5_K) {
    uint32_t s[4];
    k4_scales(blk + 4, s);
    spread_pairs(s[0], s[1], h.sc);
    spread_pairs(s[2], s[3], h.mn);
    h.d = half_at(blk);
    h.md = half_at(blk + 2);
    h.mn_shift = -1;
  } else if constexpr (Format == kQ6_K) {
    for (int w = 0; w < 4; ++w) h.sc[w] = word_at(blk + 192 + 4 * w);
    h.d = h.md = half_at(blk + 208);
    h.mn_shift = 5;
  } else if constexpr (Format == kQ3_K) {
    // ggml's q3_K scale unpacking: 16 scales of 6 bits, low 4 bits in bytes 0-7, high 2 in bytes 8-11.
    constexpr uint32_t low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const uint32_t a0 = word_at(blk + 96), a1 = word_at(blk + 100), t = word_at(blk + 104);
    const uint32_t words[4] = {(a0 & low4) | ((t & low2) << 4), (a1 & low4) | (((t >> 2) & low2) << 4),
                               ((a0 >> 4) & low4) | (((t >> 4) & low2) << 4),
                               ((a1 >> 4) & low4) | (((t >> 6) & low2) << 4)};
    for (int w = 0; w < 4; ++w) h.sc[w] = minus32(words[w]);
    h.d = h.md = half_at(blk + 108);
    h.mn_shift = 2;
  } else if constexpr (Format == kQ2_K) {
    for (int w = 0; w < 4; ++w) {
      const uint32_t s = word_at(blk + 4 * w);
      h.sc[w] = s & 0x0f0f0f0f;
      h.mn[w] = (s >> 4) & 0x0f0f0f0f;
    }
    h.d = half_at(blk + 80);
    h.md = half_at(blk + 82);
    h.mn_shift = -1;
  } else {  // iq4_xs
    const uint32_t high = blk[2] | (static_cast<uint32_t>(blk[3]) << 8), low = word_at(blk + 4);
    uint32_t ls[2] = {0, 0};
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t v = ((low >> (4 * ib)) & 0xF) | (((high >> (2 * ib)) & 3) << 4);
      ls[ib / 4] |= v << (8 * (ib % 4));
    }
    spread_pairs(minus32(ls[0]), minus32(ls[1]), h.sc);
    h.d = half_at(blk);
    h.md = 0.f;
    h.mn_shift = 0;
  }
  return h;
}

inline int8_t sc_of(const Header& h, int c) { return static_cast<int8_t>((h.sc[c / 4] >> (8 * (c % 4))) & 0xFF); }
inline int32_t mn_of(const Header& h, int c) {
  if (h.mn_shift > 0) return sc_of(h, c) * (1 << h.mn_shift);
  return h.mn_shift < 0 ? static_cast<int32_t>((h.mn[c / 4] >> (8 * (c % 4))) & 0xFF) : 0;
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
// mn as 16 int16 lanes (chunk c in lane c).
inline __m256i mins16(const Header& h) {
  if (h.mn_shift > 0) return _mm256_slli_epi16(_mm256_cvtepi8_epi16(words128(h.sc)), h.mn_shift);
  return _mm256_cvtepu8_epi16(words128(h.mn));
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
