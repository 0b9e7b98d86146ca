// y = x W^T (+ b) for a weight kept in ggml's packed blocks of 32 (q4_0, q4_1, q8_0, q5_0, q5_1, iq4_nl, exactly as
// a GGUF file stores them: FORMATS in frame.interfaces.quantization), float32 or bfloat16 x: the linears of a GGUF
// model served with `--quantization gguf`.
//
// The weight is never expanded in memory. Each row of x is first quantized per block of 32 inputs to int8 with
// one scale d_x = max|x| / 127 (and s_x = d_x * sum(q_x)), exactly as llama.cpp's q8_0 and q8_1 blocks hold x for
// its own dot products: d_x rounded to float16, and q8_1's s_x (q4_1, q5_1) the float16 of the unrounded product;
// a weight block is then unpacked in registers once (ggml_blocks.h: nibbles, a 5th bit, or iq4_nl's table become
// 32 bytes) and multiplied by the int8 inputs of up to four rows with integer multiply-adds (`vpmaddubsw`,
// `vpmaddwd`), scaled once per block:
//   q4_0: w = d (q - 8)    ->  d_w (d_x sum(q q_x) - 8 s_x)      q5_0: the same with q - 16
//   q4_1: w = d q + m      ->  d_w d_x sum(q q_x) + m s_x        q5_1: the same with 5-bit q
//   q8_0: w = d q          ->  d_w d_x sum(q q_x)                iq4_nl: the same with q = kvalues_iq4nl[nibble]
// A decode step reads the weight once at 4.5-8.5 bits per value, which is what bounds it.
//
// `portable` runs the same arithmetic in plain C++ (the path of CPUs without AVX2, and its test here); both sum a
// block's 32 integer products exactly, so they differ only in the order of the float32 block sums. This layout's
// AVX2 path (rows_avx2) now serves only callers that ask for it: the repacked one below reads faster on AVX2 too.
//
// `ggml_linear_repacked` is the AVX-512 VNNI path (Ice Lake and later Xeons, Zen 4): the same blocks repacked once
// at load (repack.repack_blocks) so that one zmm holds 16 output rows' values of 4 consecutive inputs, and one
// `vpdpbusd` multiplies them by 4 of x's int8 values (broadcast) for all 16 rows at once, with no horizontal sums.
// At one row it reads the weight at the machine's streaming rate: all of SmolLM2-135M's Q4_1 linears (66 MB of
// q4_1, a 30 MB q8_0 output matrix) in 2.6 ms on 2 cores of a Xeon, against 10.8 ms for the AVX2 path and 2.5
// ms for a plain read of the same bytes; four rows in 3.3 ms. CPUs with AVX2 and no VNNI read the same repacked
// blocks 8 rows a ymm (ggml_repacked_avx2.h): the `Repacked` product runs either. Groups come in sets of four whose
// blocks interleave, so a one-row product reads a set as one stream (RepackedSets).
//
// With AVX-512 VNNI the layout also holds q4_K, q5_K, q6_K, q3_K, q2_K and iq4_xs (repack.repack_q4_k, ...): each
// chunk of 32 of a super-block a block, x rounded per 256 as llama.cpp's q8_K, and each super-block summed as the same
// integers and scaled with the same float operations as kquant_linear.cpp's portable path, so with its bits. On the
// file's super-blocks a lone row was compute-bound (26-30 GB/s in L2 on a Zen 5 core, q3_K 16); here it reads at
// 75-95% of the read floor, and a prefill runs 1.7-3.3x as fast.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bfloat16_bits.h"
#include "direct_ops.h"
#include "ggml_blocks.h"
#include "ggml_repacked_avx2.h"
#include "linear_bias.h"
#include "swiglu.h"

// The repacked layout is read with AVX-512 VNNI where the build has it, else with AVX2 (ggml_repacked_avx2.h).
#if FRAME_GGML_VNNI || FRAME_GGML_AVX2
#define FRAME_GGML_REPACKED 1
#endif

namespace {

constexpr int64_t kBlock = 32;
constexpr int kRowTile = 4;  // rows of x per pass over a weight row

using namespace ggml_blocks;

// x's rows quantized per block: q [m][k] int8, d and s [m][k / 32] float32, sum [m][k / 32] (sum of q, which the
// VNNI path's offset weights need as an integer), and for the super-block formats low [m][k / 32], the sum of each
// block's first 16 q (the formats with a scale or min per 16 inputs take x's sums per 16: low, and sum - low).
struct QuantizedView {
  const int8_t* q;
  const float *d, *s;
  const int32_t* sum;
  const int32_t* low;
};

struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> sum, low;

  operator QuantizedView() const { return {q.data(), d.data(), s.data(), sum.data(), low.data()}; }
};

// llama.cpp keeps a block's d_x as float16, and q8_1's s_x (the weight with a min: q4_1, q5_1) as the float16 of
// d_x * sum(q_x) with the unrounded d_x; for the offset formats s_x is d_x * sum(q_x) exactly (its dot products take
// the offset in the integer sum). Rounding as it does keeps frame's products within float32 noise of its (on
// SmolLM2's q5_1 inputs they differed by up to 1.6e-3 of sum(|w| |x|) with d_x and s_x left in float32).
inline void block_scales(float amax, int sum, bool q8_1, float* d, float* s) {
  const float scale = amax / 127.f;
  *d = static_cast<float>(c10::Half(scale));
  *s = q8_1 ? static_cast<float>(c10::Half(scale * static_cast<float>(sum))) : *d * static_cast<float>(sum);
}

template <typename T>
void quantize_row(const T* x, int64_t k, bool q8_1, int8_t* q, float* d, float* s, int32_t* sums) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    float xs[kBlock];
    float amax = 0.f;
    for (int i = 0; i < kBlock; ++i) {
      xs[i] = static_cast<float>(x[b * kBlock + i]);
      amax = std::max(amax, std::fabs(xs[i]));
    }
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      const int v = static_cast<int>(std::nearbyint(xs[i] * inv));
      q[b * kBlock + i] = static_cast<int8_t>(v);
      sum += v;
    }
    block_scales(amax, sum, q8_1, d + b, s + b);
    sums[b] = sum;
  }
}

#if FRAME_GGML_VNNI
// quantize_row 16 lanes at a time, bitwise the same: max|x| is exact in any order, x * inv is the same float
// product, and vcvtps2dq rounds half to even like nearbyint (both follow MXCSR's default mode).
inline __m512 load16_as_float(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16_as_float(const c10::BFloat16* x) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

template <typename T>
void quantize_row_avx512(const T* x, int64_t k, bool q8_1, int8_t* q, float* d, float* s, int32_t* sums) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const __m512 lo = load16_as_float(x + b * kBlock), hi = load16_as_float(x + b * kBlock + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv)), qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock), _mm512_cvtepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock + 16), _mm512_cvtepi32_epi8(qhi));
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    block_scales(amax, sum, q8_1, d + b, s + b);
    sums[b] = sum;
  }
}
#endif

// The K-quants' x as llama.cpp's q8_K holds it for its K-quant dot products: per super-block of 256 one float32 scale
// d_x = max|x| / 127, left unrounded, set on each of its 8 blocks, and per block the integer sum(q_x) for the
// mins (and s = d_x sum(q_x), which the view holds for every format), and the integer sum of its first 16 (`low`).
template <typename T>
void quantize_row_super(const T* x, int64_t k, int8_t* q, float* d, float* s, int32_t* sums, int32_t* low) {
  constexpr int64_t kSuper = 256;
  for (int64_t first = 0; first < k; first += kSuper) {
#if FRAME_GGML_VNNI
    // 16 lanes at a time, bitwise the plain loop (as quantize_row_avx512): it took ~15% of a lone row's q4_K call.
    __m512 top = _mm512_setzero_ps();
    for (int64_t i = first; i < first + kSuper; i += 16)
      top = _mm512_max_ps(top, _mm512_abs_ps(load16_as_float(x + i)));
    const float amax = _mm512_reduce_max_ps(top);
#else
    float amax = 0.f;
    for (int64_t i = first; i < first + kSuper; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
#endif
    const float inv = amax > 0.f ? 127.f / amax : 0.f, dx = amax / 127.f;
    for (int64_t b = first / kBlock; b < (first + kSuper) / kBlock; ++b) {
#if FRAME_GGML_VNNI
      const __m512 scale = _mm512_set1_ps(inv);
      const __m512i lo = _mm512_cvtps_epi32(_mm512_mul_ps(load16_as_float(x + b * kBlock), scale));
      const __m512i hi = _mm512_cvtps_epi32(_mm512_mul_ps(load16_as_float(x + b * kBlock + 16), scale));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock), _mm512_cvtepi32_epi8(lo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock + 16), _mm512_cvtepi32_epi8(hi));
      const int first16 = _mm512_reduce_add_epi32(lo);
      const int sum = first16 + _mm512_reduce_add_epi32(hi);
#else
      int sum = 0, first16 = 0;
      for (int64_t i = b * kBlock; i < (b + 1) * kBlock; ++i) {
        const int v = static_cast<int>(std::nearbyint(static_cast<float>(x[i]) * inv));
        q[i] = static_cast<int8_t>(v);
        sum += v;
        if (i < b * kBlock + 16) first16 += v;
      }
#endif
      d[b] = dx;
      s[b] = dx * static_cast<float>(sum);
      sums[b] = sum;
      low[b] = first16;
    }
  }
}

// Row `r` of x ([rows, k], float32 where `is_float`, else bfloat16) quantized for a weight of `format` into q [k],
// d, s and sum [k / 32]: as llama.cpp's q8_1 for a format with a min, its q8_0 otherwise, its q8_K for a K-quant
// (with low [k / 32] too). `simd`: the AVX-512 loop where this build has it (the same values); the portable path
// keeps plain C++.
void quantize_x_row(const void* x, bool is_float, int64_t r, int64_t k, bool simd, int64_t format, int8_t* q,
                    float* d, float* s, int32_t* sum, int32_t* low) {
  const float* xf = is_float ? static_cast<const float*>(x) + r * k : nullptr;
  const c10::BFloat16* xb = is_float ? nullptr : static_cast<const c10::BFloat16*>(x) + r * k;
  if (super_block(format)) {
    if (is_float) quantize_row_super(xf, k, q, d, s, sum, low);
    else quantize_row_super(xb, k, q, d, s, sum, low);
    return;
  }
  const bool q8_1 = has_min(format);
#if FRAME_GGML_VNNI
  if (simd) {
    if (is_float) quantize_row_avx512(xf, k, q8_1, q, d, s, sum);
    else quantize_row_avx512(xb, k, q8_1, q, d, s, sum);
    return;
  }
#endif
  if (is_float) quantize_row(xf, k, q8_1, q, d, s, sum);
  else quantize_row(xb, k, q8_1, q, d, s, sum);
}

QuantizedRows quantize_rows(const at::Tensor& x, bool simd, int64_t format) {
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t nb = k / kBlock;
  QuantizedRows out{std::vector<int8_t>(m * k), std::vector<float>(m * nb), std::vector<float>(m * nb),
                    std::vector<int32_t>(m * nb), std::vector<int32_t>(super_block(format) ? m * nb : 0)};
  const bool is_float = x.scalar_type() == at::kFloat;
  const void* data = x.data_ptr();
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int32_t* low = out.low.empty() ? nullptr : out.low.data() + r * nb;  // the super-block formats' only
      quantize_x_row(data, is_float, r, k, simd, format, out.q.data() + r * k, out.d.data() + r * nb,
                     out.s.data() + r * nb, out.sum.data() + r * nb, low);
    }
  });
  return out;
}

// One weight row against R rows of quantized x, plain C++.
void row_portable(int64_t format, const uint8_t* w, int64_t nb, const QuantizedView& xq, int64_t r0, int rows,
                  int64_t k, float* dots) {
  const int64_t bb = block_bytes(format);
  const float offset = static_cast<float>(offset_of(format));
  for (int r = 0; r < rows; ++r) {
    const int8_t* qx = xq.q + (r0 + r) * k;
    const float* dx = xq.d + (r0 + r) * nb;
    const float* sx = xq.s + (r0 + r) * nb;
    float total = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * bb;
      const int8_t* xb = qx + b * kBlock;
      int32_t u[kBlock];
      values_portable(format, blk, u);
      int dot = 0;
      for (int i = 0; i < kBlock; ++i) dot += u[i] * xb[i];
      total += half_at(blk) * (dx[b] * static_cast<float>(dot) - offset * sx[b]);
      if (has_min(format)) total += half_at(blk + 2) * sx[b];
    }
    dots[r] = total;
  }
}

#if FRAME_GGML_AVX2
// A block's float16 scale with F16C (c10::Half converts in software, per block and per row of x).
inline float half_at_f16c(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return _cvtsh_ss(bits);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// sum over 32 of u[i] * s[i] as 8 int32 lanes (u unsigned bytes, s signed).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

template <int64_t Format, int R>
void row_avx2(const uint8_t* w, int64_t nb, const QuantizedView& xq, int64_t r0, int64_t k, float* dots) {
  constexpr int64_t bb = block_bytes(Format);
  __m256 acc[R];
  float corr[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    corr[r] = 0.f;
  }
  const int8_t* qx = xq.q + r0 * k;
  const float* dx = xq.d + r0 * nb;
  const float* sx = xq.s + r0 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * bb;
    const float dw = half_at_f16c(blk);
    // q4_1 / q5_1: m s_x; q4_0 / q5_0: -offset d_w s_x; signed values: none.
    const float mw = has_min(Format) ? half_at_f16c(blk + 2) : -static_cast<float>(offset_of(Format)) * dw;
    const __m256i wq = values_avx2<Format>(blk);
    const __m256i wabs = signed_values(Format) ? _mm256_sign_epi8(wq, wq) : wq;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + r * k + b * kBlock));
      if constexpr (signed_values(Format)) xb = _mm256_sign_epi8(xb, wq);  // the weight's sign moves onto x
      const __m256 dot = _mm256_cvtepi32_ps(dot_u8s8(wabs, xb));
      acc[r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(dw * dx[r * nb + b]), acc[r]);
      if constexpr (!signed_values(Format)) corr[r] += mw * sx[r * nb + b];
    }
  }
  for (int r = 0; r < R; ++r) dots[r] = hsum(acc[r]) + corr[r];
}

template <int64_t Format>
void rows_avx2(const uint8_t* w, int64_t nb, const QuantizedView& xq, int64_t r0, int rows, int64_t k, float* dots) {
  switch (rows) {
    case 1: row_avx2<Format, 1>(w, nb, xq, r0, k, dots); break;
    case 2: row_avx2<Format, 2>(w, nb, xq, r0, k, dots); break;
    case 3: row_avx2<Format, 3>(w, nb, xq, r0, k, dots); break;
    default: row_avx2<Format, 4>(w, nb, xq, r0, k, dots); break;
  }
}
#endif

#if FRAME_GGML_VNNI
// The repacked layout (repack.repack_blocks): output rows in groups of 16, one per int32 lane. For group g
// and block b, `qs` holds the block's quantized values as `quads` zmm-sized chunks [quads][16 rows][4 bytes]:
// chunk c is, for each of the 16 rows, the 4 bytes that `vpdpbusd` multiplies by x's 4 inputs 4c..4c+3.
//   q4_0 / q4_1: 4 chunks of the rows' nibble bytes, byte t of chunk c is ggml's byte 4c+t, so its low nibble is
//                input 4c+t and its high nibble input 16+4c+t: the low nibbles are chunks 0-3, the high 4-7.
//   q8_0:        8 chunks of the rows' bytes, each XOR 0x80 (q + 128, unsigned) for vpdpbusd's u8 operand.
//   iq4_nl:      as q4_0; the nibbles index a table of its levels + 128 (vpshufb) in registers.
//   q5_0 / q5_1: as q4_0, and a fifth chunk of 8 64-bit masks of the rows' high bits (ggml_blocks.h).
// `scales` holds the 16 rows' float16 d (then, q4_1 / q5_1, m) per block, [16] each. Groups come in sets of
// kSetGroups (RepackedSets below) whose blocks interleave, so a one-row product reads each set as one stream.
constexpr int kGroup = 16;
constexpr int kVnniRows = 4;              // rows of x per pass over a group (measured: 8 and two chains no faster)
constexpr int64_t kPrefetchAhead = 1024;  // bytes of a group's own blocks asked for ahead of the one multiplied
// Bytes of a set's stream asked for ahead of the block row being multiplied (group_set_vnni): on a Zen 5 core a
// set read 4 KB ahead streamed at 97-99% of a plain read, 2 KB ahead at 81% (benchmarks/ggml_layout_ab.cpp).
constexpr int64_t kStreamAhead = 4096;
#endif

#if FRAME_GGML_REPACKED
// Groups of 16 output rows taken in step by a one-row product; repack.SET_GROUPS packs them so.
constexpr int kSetGroups = 4;

// Where the repacked layout keeps a group's blocks. Groups kSetGroups s.. kSetGroups s + kSetGroups - 1 (the
// last set fewer) form set s, which fills the bytes those groups would fill one after the other, but block-major:
// block b of each of its groups side by side, then block b + 1. A one-row product reads a set's groups in step
// from one stream (four streams at once held a core to 50-60% of its read rate); a batched one reads a group's
// blocks a block row apart.
struct GroupPlace {
  int64_t q, s;              // the group's first block: bytes into qs, values into scales
  int64_t qstride, sstride;  // from one of its blocks (scale records) to the next: its set's row of them
  int64_t set_end;           // the group after its set
};

struct RepackedSets {
  const uint8_t* qs;
  const uint16_t* scales;
  int64_t groups, nb, group_qbytes, group_scales;  // a group's bytes in qs and values in scales
  int64_t scale_blocks;                            // a group's scale records: nb, or q4_K's super-blocks

  GroupPlace place(int64_t g) const {
    const int64_t first = g / kSetGroups * kSetGroups, count = std::min<int64_t>(kSetGroups, groups - first);
    const int64_t qbytes = group_qbytes / nb, sbytes = group_scales / scale_blocks;
    return {first * group_qbytes + (g - first) * qbytes, first * group_scales + (g - first) * sbytes, count * qbytes,
            count * sbytes, first + count};
  }

  // Whether group g begins a set of kSetGroups groups that ends by `end`: 2-4 rows of x read it as one stream.
  bool whole_set(int64_t g, int64_t end) const {
    return g % kSetGroups == 0 && g + kSetGroups <= std::min(end, groups);
  }
};
#endif

#if FRAME_GGML_VNNI
inline __m512i broadcast_quad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// A group's scale record: one per block (float16 d, then m: scales_of values of 16 rows), or one per super-block
// of 8 blocks: q4_K's and q5_K's per block 16 sc bytes then 16 mn bytes (the 16 rows' 6-bit values), then the
// 16 rows' float16 d, then dmin (160 values); q6_K's per chunk of 16 inputs its 16 rows' int8 sc, then the rows'
// float16 d (144).
template <int64_t Format>
constexpr int64_t blocks_per_scale() { return super_block(Format) ? 8 : 1; }
template <int64_t Format>
constexpr int64_t scale_values() { return scale_rows_for(Format) * kGroup; }

// q6_K's block b against one row of x (its broadcast quads xq4 and 16-input sums): the 16 rows' sc_lo (u - 32) . x
// over inputs 0-15 plus sc_hi (u - 32) . x over 16-31, exact integers (each term at most 16 x 63 x 127 x 128, a
// super-block's eight blocks under 2^31): the super-block stays one integer until d and d_x scale it, as in
// llama.cpp's dot product and the file-layout kernel. q3_K's so, with u - 4.
// The block's values w against x's broadcast quads xq4, added to `low` over inputs 0-15 and to `high` over 16-31.
inline void dot_halves(const __m512i* w, const __m512i* xq4, __m512i& low, __m512i& high) {
  for (int i = 0; i < 4; ++i) {
    low = _mm512_dpbusd_epi32(low, w[i], xq4[i]);
    high = _mm512_dpbusd_epi32(high, w[i + 4], xq4[i + 4]);
  }
}

template <int64_t Format>
inline __m512i q6_block(const __m512i* w, const __m512i* xq4, int32_t x_low, int32_t x_high, const uint16_t* record,
                        int64_t b) {
  constexpr int32_t offset = offset_per_16(Format);
  __m512i low = _mm512_set1_epi32(-offset * x_low), high = _mm512_set1_epi32(-offset * x_high);
  dot_halves(w, xq4, low, high);
  const uint8_t* sc = reinterpret_cast<const uint8_t*>(record) + 32 * (b % 8);
  const __m512i sc_low = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
  const __m512i sc_high = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16)));
  return _mm512_add_epi32(_mm512_mullo_epi32(low, sc_low), _mm512_mullo_epi32(high, sc_high));
}

// acc + d_x (d S) for a super-block's integer S and the 16 rows' d in their record: the file-layout kernel's and
// its portable path's float operations, so q6_K repacked has their bits (a rounding order of its own moved the
// llama.cpp matrix's Q4_K_M perplexity by 1.6%: x's int8 steps turn an ulp upstream into whole steps).
inline __m512 q6_scaled(__m512i whole, __m512 dx, const uint16_t* record, __m512 acc) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(record + 128)));
  return _mm512_fmadd_ps(dx, _mm512_mul_ps(d, _mm512_cvtepi32_ps(whole)), acc);
}

// acc + (d_x d) S for an iq4_xs super-block (its d after the 8 chunks' sc): the portable path's order, which is
// llama.cpp's (d_x d first; with d (d_x S) the llama.cpp matrix's IQ4_XS perplexity moved from +0.73% to +1.08%).
inline __m512 iq4xs_scaled(__m512i whole, __m512 dx, const uint16_t* record, __m512 acc) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(record + 64)));
  return _mm512_fmadd_ps(_mm512_mul_ps(dx, d), _mm512_cvtepi32_ps(whole), acc);
}

// iq4_xs's block b (its 16 rows' exact dot with x's block, the table's signed levels): sc dot into the super-block's
// integer S (each term at most 32 x 127 x 127 x 32, eight under 2^31), the int8 sc per chunk from the record.
inline void iq4xs_block(__m512i dot, const uint16_t* record, int64_t b, __m512i& whole) {
  const int8_t* sc = reinterpret_cast<const int8_t*>(record) + 16 * (b % 8);
  const __m512i scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
  const __m512i t = _mm512_mullo_epi32(dot, scale);
  whole = b % 8 == 0 ? t : _mm512_add_epi32(whole, t);
}

// q4_K's or q5_K's block b (its 16 rows' exact dot with x's block, x's block sum): sc dot into the super-block's
// integer S and mn sum(q_x) into its M, as the file-layout kernel's portable path and llama.cpp sum them (under
// 2^26 for q5_K).
inline void q4k_block(__m512i dot, int32_t x_sum, const uint16_t* record, int64_t b, __m512i& whole, __m512i& mins) {
  const uint8_t* chunk = reinterpret_cast<const uint8_t*>(record) + 32 * (b % 8);
  const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk)));
  const __m512i mn = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 16)));
  const __m512i sc_dot = _mm512_mullo_epi32(dot, sc), mn_sum = _mm512_mullo_epi32(_mm512_set1_epi32(x_sum), mn);
  whole = b % 8 == 0 ? sc_dot : _mm512_add_epi32(whole, sc_dot);
  mins = b % 8 == 0 ? mn_sum : _mm512_add_epi32(mins, mn_sum);
}

// q2_K's block b against one row of x (its broadcast quads xq4 and 16-input sums): the 16 rows' sc_lo u . x over
// inputs 0-15 plus sc_hi u . x over 16-31 into the super-block's integer S, mn_lo sum(q_x) + mn_hi ... into its M,
// sc and mn the low and high nibbles of the record's byte per row and chunk of 16, as ggml stores them.
inline void q2k_block(const __m512i* w, const __m512i* xq4, int32_t x_low, int32_t x_high, const uint16_t* record,
                      int64_t b, __m512i& whole, __m512i& mins) {
  __m512i low = _mm512_setzero_si512(), high = _mm512_setzero_si512();
  dot_halves(w, xq4, low, high);
  const uint8_t* chunk = reinterpret_cast<const uint8_t*>(record) + 32 * (b % 8);
  const __m512i packed_low = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk)));
  const __m512i packed_high = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 16)));
  const __m512i nibble = _mm512_set1_epi32(0xF);
  const __m512i sc_low = _mm512_and_si512(packed_low, nibble), sc_high = _mm512_and_si512(packed_high, nibble);
  const __m512i mn_low = _mm512_srli_epi32(packed_low, 4), mn_high = _mm512_srli_epi32(packed_high, 4);
  const __m512i sc_dot = _mm512_add_epi32(_mm512_mullo_epi32(low, sc_low), _mm512_mullo_epi32(high, sc_high));
  const __m512i mn_sum = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_set1_epi32(x_low), mn_low),
                                          _mm512_mullo_epi32(_mm512_set1_epi32(x_high), mn_high));
  whole = b % 8 == 0 ? sc_dot : _mm512_add_epi32(whole, sc_dot);
  mins = b % 8 == 0 ? mn_sum : _mm512_add_epi32(mins, mn_sum);
}

// acc + d_x (d S - dmin M) for a q4_K, q5_K or q2_K super-block, the portable path's float operations (so its bits).
inline __m512 q4k_scaled(__m512i whole, __m512i mins, __m512 dx, const uint16_t* record, __m512 acc) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(record + 128)));
  const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(record + 144)));
  const __m512 t = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(whole), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mins)));
  return _mm512_fmadd_ps(dx, t, acc);
}

// Block b's 16 rows' d and m (acc += dot dx d + m sx) from its group's scale record `sb`, for the formats scaled
// block by block (the K-quants are not: their super-blocks are summed as integers, q4k_block and q6_block).
template <int64_t Format>
inline void block_scales(const uint16_t* sb, __m512& dw, __m512& mw) {
  dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb)));
  mw = has_min(Format) ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 16)))
                       : _mm512_setzero_ps();
}

// Where group_set_vnni asks for the weight ahead: into L2 on AMD (on a Zen 4 core four groups' streams asked into L1
// held its miss buffers: a one-row step's q4_1 linears 5.9 -> 4.8 ms on one core, 3.6 -> 3.0 on two), into L1 on
// Intel's Xeons with AMX (there 3-5% faster than L2 at one and two threads, benchmarks/decode_rows.py's step).
#if defined(__AMX_TILE__)
constexpr _mm_hint kSetHint = _MM_HINT_T0;
#else
constexpr _mm_hint kSetHint = _MM_HINT_T1;
#endif

// G groups of 16 output rows side by side in a set's block rows (the first at qs and scales, its blocks `qstride`
// bytes and scale records `sstride` values apart) against R rows of quantized x (rows r0.. of xq): acc[R g + r]
// lane j = group g's row j's dot with x's row r. G = 1 reads one group's blocks a block row apart; a whole set (G =
// its groups) reads the set as one stream, as a lone row does: at 2-4 rows of x, group by group read 10-25% slower
// than the same groups stored one after another (Zen 5, q4_1). Each group's operations are the same either way.
template <int64_t Format, int R, int G = 1>
void group_vnni(const uint8_t* qs, int64_t qstride, const uint16_t* scales, int64_t sstride, int64_t nb,
                const QuantizedView& xq, int64_t r0, int64_t k, __m512* acc) {
  constexpr int quads = quads_of<Format>();
  constexpr int64_t qbytes = quads * 64, svalues = scale_values<Format>();
  constexpr int32_t offset = vnni_offset_of<Format>();
  // A group's own blocks 1 KB ahead; a set's rows kStreamAhead bytes ahead.
  const int64_t blocks_ahead = G == 1 ? std::max<int64_t>(1, kPrefetchAhead / qbytes)
                                      : (kStreamAhead + qstride - 1) / qstride;
  for (int i = 0; i < G * R; ++i) acc[i] = _mm512_setzero_ps();
  const int8_t* qx = xq.q + r0 * k;
  const float* dx = xq.d + r0 * nb;
  const float* sx = xq.s + r0 * nb;
  const int32_t* sumx = xq.sum + r0 * nb;
  const int32_t* lowx = super_block(Format) ? xq.low + r0 * nb : nullptr;
  constexpr int64_t per_scale = blocks_per_scale<Format>();
  __m512i whole_all[G * R], mins_all[G * R];  // the K-quants: each row's super-block so far, integers
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* row = qs + b * qstride;
    const uint16_t* srow = scales + b / per_scale * sstride;
    // The weight streams from memory once: asking for it 1 KB ahead into L1 took one row's step from 2.9 to 2.6
    // ms (a plain read of the same bytes: 2.5), four rows' from 4.3 to 3.3.
    for (int64_t c = 0; c < G * qbytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row + blocks_ahead * qstride + c), G == 1 ? _MM_HINT_T0 : kSetHint);
    if (b % per_scale == 0)
      for (int64_t c = 0; c < G * svalues * 2; c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(srow + (blocks_ahead + per_scale - 1) / per_scale * sstride) + c,
                     G == 1 ? _MM_HINT_T0 : kSetHint);
#pragma GCC unroll 1
    for (int g = 0; g < G; ++g) {
      const uint8_t* wb = row + g * qbytes;
      const uint16_t* sb = srow + g * svalues;
      __m512* acc_g = acc + g * R;
      __m512i* whole = whole_all + g * R;
      __m512i* mins = mins_all + g * R;
      __m512i w[8];  // w[i]: the 16 rows' values of inputs 4i..4i+3, unsigned
      values_vnni<Format>(wb, w);
      if constexpr (sums_per_16(Format)) {  // each row's super-block summed as integers, then scaled once
        for (int r = 0; r < R; ++r) {
          const int8_t* xb = qx + r * k + b * kBlock;
          __m512i xq4[8];
          for (int i = 0; i < 4; ++i) {
            xq4[i] = broadcast_quad(xb + 4 * i);
            xq4[i + 4] = broadcast_quad(xb + 16 + 4 * i);
          }
          const int32_t x_low = lowx[r * nb + b], x_high = sumx[r * nb + b] - x_low;
          if constexpr (Format == kQ2_K) {
            q2k_block(w, xq4, x_low, x_high, sb, b, whole[r], mins[r]);
            if (b % 8 == 7) acc_g[r] = q4k_scaled(whole[r], mins[r], _mm512_set1_ps(dx[r * nb + b]), sb, acc_g[r]);
          } else {
            whole[r] = _mm512_add_epi32(b % 8 == 0 ? _mm512_setzero_si512() : whole[r],
                                        q6_block<Format>(w, xq4, x_low, x_high, sb, b));
            if (b % 8 == 7) acc_g[r] = q6_scaled(whole[r], _mm512_set1_ps(dx[r * nb + b]), sb, acc_g[r]);
          }
        }
        continue;
      }
      // Quad-major over the R rows: R independent vpdpbusd chains, so the multiply-adds of different rows overlap
      // instead of waiting on each other. Each starts at -offset * sum(q_x), which takes the unsigned operand's
      // offset back out.
      __m512i lo[R];
      for (int r = 0; r < R; ++r)
        lo[r] = offset ? _mm512_set1_epi32(-offset * sumx[r * nb + b]) : _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int8_t* xb = qx + r * k + b * kBlock;
          lo[r] = _mm512_dpbusd_epi32(lo[r], w[i], broadcast_quad(xb + 4 * i));
          lo[r] = _mm512_dpbusd_epi32(lo[r], w[i + 4], broadcast_quad(xb + 16 + 4 * i));
        }
      }
      if constexpr (Format == kIQ4_XS) {
        for (int r = 0; r < R; ++r) {
          iq4xs_block(lo[r], sb, b, whole[r]);
          if (b % 8 == 7) acc_g[r] = iq4xs_scaled(whole[r], _mm512_set1_ps(dx[r * nb + b]), sb, acc_g[r]);
        }
        continue;
      }
      if constexpr (chunk_mins(Format)) {
        for (int r = 0; r < R; ++r) {
          q4k_block(lo[r], sumx[r * nb + b], sb, b, whole[r], mins[r]);
          if (b % 8 == 7) acc_g[r] = q4k_scaled(whole[r], mins[r], _mm512_set1_ps(dx[r * nb + b]), sb, acc_g[r]);
        }
        continue;
      }
      __m512 dw, mw;
      block_scales<Format>(sb, dw, mw);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i dot = lo[r];
        const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(dx[r * nb + b]));
        acc_g[r] = _mm512_fmadd_ps(scaled, dw, acc_g[r]);
        if constexpr (has_min(Format)) acc_g[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx[r * nb + b]), acc_g[r]);
      }
    }
  }
}

// q4_0 / q4_1 as values_vnni gives them, but with each high nibble left in place (byte & 0xF0, 16 times the
// nibble): w[0..3] the low nibbles, w[4..7] the high ones times 16. A vpdpbusd chain over w[4..7] sums 16 times the
// high nibbles' products exactly (at most 16 x 240 x 127 per lane), so one arithmetic shift per block replaces
// values_vnni's four vpsrlw, which compete with vpdpbusd for the same port on Intel cores.
inline void nibbles_in_place(const uint8_t* wb, __m512i* w) {
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(static_cast<char>(0xF0));
  for (int c = 0; c < 4; ++c) {
    const __m512i packed = _mm512_loadu_si512(wb + 64 * c);
    w[c] = _mm512_and_si512(packed, low);
    w[c + 4] = _mm512_and_si512(packed, high);
  }
}

// One group's block against x's broadcast quads xq4: the 16 rows' exact integer dot products, minus offset * sum(q_x)
// (`start`). Two chains of four vpdpbusd (inputs 0-15 and 16-31) instead of one of eight halve the latency a block
// waits on.
template <int64_t Format>
inline __m512i block_dot(const uint8_t* wb, const __m512i* xq4, __m512i start) {
  constexpr bool in_place = Format == kQ4_0 || Format == kQ4_1 || Format == kQ4_K;
  __m512i w[8];
  if constexpr (in_place) nibbles_in_place(wb, w);
  else values_vnni<Format>(wb, w);
  __m512i low = start, high = _mm512_setzero_si512();
  dot_halves(w, xq4, low, high);
  return _mm512_add_epi32(low, in_place ? _mm512_srai_epi32(high, 4) : high);
}


// G groups side by side in a set's block rows (the first at qs and scales, its blocks qstride bytes and sstride
// values apart) against one row of quantized x: a decode row's product. out[i] lane j = group i's row j's dot.
// With one group at a time a row's step waited on the weight's latency (one chain of vpdpbusd per block); G
// chains overlap, and a whole set (G = its groups) is one stream asked for kStreamAhead bytes ahead, which runs on
// into the next set where the thread's groups go on. The sums stay in registers and are stored once at the end.
template <int64_t Format, int G>
void group_set_vnni(const uint8_t* qs, int64_t qstride, const uint16_t* scales, int64_t sstride, int64_t nb,
                    const QuantizedView& xq, __m512* out) {
  constexpr int quads = quads_of<Format>();
  constexpr int64_t qbytes = quads * 64, sbytes = scale_values<Format>(), per_scale = blocks_per_scale<Format>();
  constexpr int32_t offset = vnni_offset_of<Format>();
  // Whole block rows ahead, the scales as many records ahead as cover as many blocks.
  const int64_t rows_ahead = (kStreamAhead + qstride - 1) / qstride;
  const int64_t records_ahead = (rows_ahead + per_scale - 1) / per_scale;
  const int64_t q_ahead = rows_ahead * qstride, s_ahead = records_ahead * sstride;
  // The rows before the first one asked for ahead, asked for at once: their misses overlap rather than each
  // waiting in turn at the start of a call (a set that follows another finds them there already).
  for (int64_t b = 0; b < std::min(rows_ahead, nb); ++b)
    for (int64_t c = 0; c < G * qbytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(qs + b * qstride + c), kSetHint);
  for (int64_t r = 0; r < std::min(records_ahead, nb / per_scale); ++r)
    for (int64_t c = 0; c < G * sbytes * 2; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(scales + r * sstride) + c, kSetHint);
  __m512 acc[G];
  __m512i whole[G], mins[G];  // q6_K, q4_K: each group's super-block so far, integers
  for (int i = 0; i < G; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* row = qs + b * qstride;
    const uint16_t* srow = scales + b / per_scale * sstride;
    for (int64_t c = 0; c < G * qbytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row + q_ahead + c), kSetHint);
    if (b % per_scale == 0)
      for (int64_t c = 0; c < G * sbytes * 2; c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(srow + s_ahead) + c, kSetHint);
    const int8_t* xb = xq.q + b * kBlock;
    __m512i xq4[8];  // x's quads: inputs 4i..4i+3 (i < 4) and 16 + 4(i - 4).. (i >= 4), broadcast
    for (int i = 0; i < 4; ++i) {
      xq4[i] = broadcast_quad(xb + 4 * i);
      xq4[i + 4] = broadcast_quad(xb + 16 + 4 * i);
    }
    const __m512 dx = _mm512_set1_ps(xq.d[b]);
    const __m512 sx = _mm512_set1_ps(xq.s[b]);
    const __m512i start = offset ? _mm512_set1_epi32(-offset * xq.sum[b]) : _mm512_setzero_si512();
    if constexpr (sums_per_16(Format)) {  // each group's super-block summed as integers, then scaled once
      const int32_t x_low = xq.low[b], x_high = xq.sum[b] - x_low;
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        __m512i w[8];
        values_vnni<Format>(row + g * qbytes, w);
        if constexpr (Format == kQ2_K) {
          q2k_block(w, xq4, x_low, x_high, srow + g * sbytes, b, whole[g], mins[g]);
          if (b % 8 == 7) acc[g] = q4k_scaled(whole[g], mins[g], dx, srow + g * sbytes, acc[g]);
        } else {
          whole[g] = _mm512_add_epi32(b % 8 == 0 ? _mm512_setzero_si512() : whole[g],
                                      q6_block<Format>(w, xq4, x_low, x_high, srow + g * sbytes, b));
          if (b % 8 == 7) acc[g] = q6_scaled(whole[g], dx, srow + g * sbytes, acc[g]);
        }
      }
      continue;
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512i dot = block_dot<Format>(row + g * qbytes, xq4, start);
      if constexpr (Format == kIQ4_XS) {
        iq4xs_block(dot, srow + g * sbytes, b, whole[g]);
        if (b % 8 == 7) acc[g] = iq4xs_scaled(whole[g], dx, srow + g * sbytes, acc[g]);
        continue;
      }
      if constexpr (chunk_mins(Format)) {
        q4k_block(dot, xq.sum[b], srow + g * sbytes, b, whole[g], mins[g]);
        if (b % 8 == 7) acc[g] = q4k_scaled(whole[g], mins[g], dx, srow + g * sbytes, acc[g]);
        continue;
      }
      __m512 dw, mw;
      block_scales<Format>(srow + g * sbytes, dw, mw);
      acc[g] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), dx), dw, acc[g]);
      if constexpr (has_min(Format)) acc[g] = _mm512_fmadd_ps(mw, sx, acc[g]);
    }
  }
  for (int i = 0; i < G; ++i) out[i] = acc[i];
}

// group_set_vnni for 1..kSetGroups groups: each count its own instance, whatever kSetGroups is (a switch written
// for four sent counts 4-7 to the 8-group kernel when the constant was raised, reading past the range).
template <int64_t Format, int G = 1>
void group_set_any(int count, const uint8_t* qs, int64_t qstride, const uint16_t* scales, int64_t sstride, int64_t nb,
                   const QuantizedView& xq, __m512* out) {
  if constexpr (G < kSetGroups) {
    if (count != G) return group_set_any<Format, G + 1>(count, qs, qstride, scales, sstride, nb, xq, out);
  }
  return group_set_vnni<Format, G>(qs, qstride, scales, sstride, nb, xq, out);
}

// Groups [g, end) of a one-row product, set by set (a thread's share may begin or end inside a set, which it
// reads in part): out[0..count) the sums of groups g.. .
template <int64_t Format>
void groups_in_sets(const RepackedSets& w, const QuantizedView& xq, int64_t g, int64_t end, __m512* out) {
  while (g < end) {
    const GroupPlace at = w.place(g);
    const int count = static_cast<int>(std::min(end, at.set_end) - g);
    group_set_any<Format>(count, w.qs + at.q, at.qstride, w.scales + at.s, at.sstride, w.nb, xq, out);
    out += count;
    g += count;
  }
}

// A thread's groups [g, end) of a one-row product, a set (or the part of one it has) at a time.
// store(sums, g, count): groups g.. of y.
template <int64_t Format, typename Store>
void group_sets_vnni(const RepackedSets& w, const QuantizedView& xq, int64_t g, int64_t end, Store&& store) {
  __m512 acc[kSetGroups];
  while (g < end) {
    const int count = static_cast<int>(std::min(end, w.place(g).set_end) - g);
    groups_in_sets<Format>(w, xq, g, g + count, acc);
    store(acc, g, count);
    g += count;
  }
}

// SwiGLU's [gate | up] weight, its `half` gate groups first: a thread's pairs [p, end) take a gate set (or part)
// and then the matching up groups, which straddle two sets where half is not a multiple of kSetGroups. A gate set
// ends by asking for the next gate set's first rows, which wait in L2 while the up groups run.
// store(gate sums, up sums, p, count): y's columns 16 p.. from pairs p...
template <int64_t Format, typename Store>
void gated_sets_vnni(const RepackedSets& w, const QuantizedView& xq, int64_t half, int64_t p, int64_t end,
                     Store&& store) {
  __m512 gate[kSetGroups], up[kSetGroups];
  while (p < end) {
    const int count = static_cast<int>(std::min(end, w.place(p).set_end) - p);
    groups_in_sets<Format>(w, xq, p, p + count, gate);
    groups_in_sets<Format>(w, xq, half + p, half + p + count, up);
    store(gate, up, p, count);
    p += count;
  }
}

// Group g alone (`whole_set` false), or the whole set it begins, against `rows` rows of x from r0.
template <int64_t Format>
void groups_vnni(const RepackedSets& w, int64_t g, const QuantizedView& xq, int64_t r0, int rows, int64_t k,
                 __m512* acc, bool whole_set = false) {
  const GroupPlace at = w.place(g);
  const uint8_t* qs = w.qs + at.q;
  const uint16_t* scales = w.scales + at.s;
  if (whole_set) {
    switch (rows) {
      case 1: return group_vnni<Format, 1, kSetGroups>(qs, at.qstride, scales, at.sstride, w.nb, xq, r0, k, acc);
      case 2: return group_vnni<Format, 2, kSetGroups>(qs, at.qstride, scales, at.sstride, w.nb, xq, r0, k, acc);
      case 3: return group_vnni<Format, 3, kSetGroups>(qs, at.qstride, scales, at.sstride, w.nb, xq, r0, k, acc);
      default: return group_vnni<Format, 4, kSetGroups>(qs, at.qstride, scales, at.sstride, w.nb, xq, r0, k, acc);
    }
  }
  switch (rows) {
    case 1: group_vnni<Format, 1>(qs, at.qstride, scales, at.sstride, w.nb, xq, r0, k, acc); break;
    case 2: group_vnni<Format, 2>(qs, at.qstride, scales, at.sstride, w.nb, xq, r0, k, acc); break;
    case 3: group_vnni<Format, 3>(qs, at.qstride, scales, at.sstride, w.nb, xq, r0, k, acc); break;
    default: group_vnni<Format, 4>(qs, at.qstride, scales, at.sstride, w.nb, xq, r0, k, acc); break;
  }
}
#endif

at::Tensor ggml_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                       const c10::optional<at::Tensor>& bias, bool portable) {
  TORCH_CHECK(format >= 0 && format < kFormats, "ggml_linear takes q4_0, q4_1, q8_0, q5_0, q5_1 or iq4_nl blocks");
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "ggml_linear takes float32 or bfloat16 x of shape [rows, in_features]");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
              "ggml_linear takes the weight's blocks as contiguous uint8 [out_features, row bytes]");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), n = blocks.size(0), nb = k / kBlock;
  TORCH_CHECK(k % kBlock == 0 && blocks.size(1) == nb * block_bytes(format),
              "the blocks do not hold in_features = ", k, " inputs per row in this format");
  const float* bias_ptr = bias_data(bias, n);
  at::Tensor y = at::empty({m, n}, xc.options());
  if (m == 0 || n == 0) return y;
  const QuantizedRows xq = quantize_rows(xc, !portable, format);
  const uint8_t* wp = blocks.data_ptr<uint8_t>();
  const int64_t row_bytes = blocks.size(1);
  const bool as_float = xc.scalar_type() == at::kFloat;
  float* yf = as_float ? y.data_ptr<float>() : nullptr;
  c10::BFloat16* yb = as_float ? nullptr : y.data_ptr<c10::BFloat16>();
#if !FRAME_GGML_AVX2
  portable = true;
#endif
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    float dots[kRowTile];
    for (int64_t col = begin; col < end; ++col) {
      const uint8_t* w = wp + col * row_bytes;
      for (int64_t r0 = 0; r0 < m; r0 += kRowTile) {
        const int rows = static_cast<int>(std::min<int64_t>(kRowTile, m - r0));
        if (portable) {
          row_portable(format, w, nb, xq, r0, rows, k, dots);
        } else {
#if FRAME_GGML_AVX2
          with_format(format, [&](auto f) { rows_avx2<decltype(f)::value>(w, nb, xq, r0, rows, k, dots); });
#endif
        }
        for (int r = 0; r < rows; ++r) {
          const float v = dots[r] + (bias_ptr ? bias_ptr[col] : 0.f);
          if (as_float) yf[(r0 + r) * n + col] = v;
          else yb[(r0 + r) * n + col] = c10::BFloat16(v);
        }
      }
    }
  });
  return y;
}

#if FRAME_GGML_AVX2 && !FRAME_GGML_VNNI
constexpr int kAvx2Rows = 4;  // rows of x per pass over a group on the AVX2 path
// Bytes of a set's stream asked for ahead of the block row being multiplied by a one-row product on this path.
constexpr int64_t kAvx2StreamAhead = 2048;

// A lone row's groups side by side (group_avx2) for 1..kSetGroups of them, each count its own instance.
template <int64_t Format, int G = 1>
void group_set_any_avx2(int count, const RepackedSets& w, const GroupPlace& at, const QuantizedView& xq,
                        __m256* acc) {
  if constexpr (G < kSetGroups) {
    if (count != G) return group_set_any_avx2<Format, G + 1>(count, w, at, xq, acc);
  }
  group_avx2<Format, 1, G>(w.qs + at.q, at.qstride, w.scales + at.s, at.sstride, w.nb, xq.q, xq.d, xq.s, xq.sum,
                           w.nb * kBlock, acc, w.group_scales / w.scale_blocks, kAvx2StreamAhead);
}

// Group g alone (`whole_set` false), or the whole set it begins, against `rows` rows of x from r0.
template <int64_t Format>
void groups_avx2(const RepackedSets& w, int64_t g, const QuantizedView& xq, int64_t r0, int rows, int64_t k,
                 __m256* acc, bool whole_set = false) {
  const GroupPlace at = w.place(g);
  const uint8_t* qs = w.qs + at.q;
  const uint16_t* scales = w.scales + at.s;
  const int64_t nb = w.nb;
  const int8_t* q = xq.q + r0 * k;
  const float *d = xq.d + r0 * nb, *s = xq.s + r0 * nb;
  const int32_t* sum = xq.sum + r0 * nb;
  if (whole_set) {
    constexpr int G = kSetGroups;
    const int64_t sv = w.group_scales / w.scale_blocks, ahead = kAvx2StreamAhead;
    switch (rows) {
      case 2: return group_avx2<Format, 2, G>(qs, at.qstride, scales, at.sstride, nb, q, d, s, sum, k, acc, sv, ahead);
      case 3: return group_avx2<Format, 3, G>(qs, at.qstride, scales, at.sstride, nb, q, d, s, sum, k, acc, sv, ahead);
      default: return group_avx2<Format, 4, G>(qs, at.qstride, scales, at.sstride, nb, q, d, s, sum, k, acc, sv, ahead);
    }
  }
  switch (rows) {
    case 1: group_avx2<Format, 1>(qs, at.qstride, scales, at.sstride, nb, q, d, s, sum, k, acc); break;
    case 2: group_avx2<Format, 2>(qs, at.qstride, scales, at.sstride, nb, q, d, s, sum, k, acc); break;
    case 3: group_avx2<Format, 3>(qs, at.qstride, scales, at.sstride, nb, q, d, s, sum, k, acc); break;
    default: group_avx2<Format, 4>(qs, at.qstride, scales, at.sstride, nb, q, d, s, sum, k, acc); break;
  }
}
#endif

#if FRAME_GGML_REPACKED
// One product over a repacked weight, its operands checked and resolved to pointers (make_repacked): the form
// every caller shares, from a plain call's parallel_for to a team's thread (and a step program's bound record,
// direct_ops.h). Work is split by unit: a group of 16 outputs, or a gated product's pair of gate and up groups.
struct Repacked {
  const void* x;
  const uint8_t* qs;
  const uint16_t* scales;
  const float* bias;
  float* yf;     // float32 out (x float32)
  uint16_t* yb;  // bfloat16 out
  int64_t m, k, n, nb, width, half, groups, group_qbytes, group_scales, scale_blocks, format;
  bool gated, as_float;

  int64_t units() const { return gated ? half : groups; }
  RepackedSets sets() const { return {qs, scales, groups, nb, group_qbytes, group_scales, scale_blocks}; }

#if FRAME_GGML_VNNI
  // Row `row` of y from column c on: one group's 16 sums plus the bias (fewer lanes past out_features).
  void store(__m512 sums, int64_t row, int64_t c) const {
    const int lanes = static_cast<int>(std::min<int64_t>(16, n - c));
    const __mmask16 mask = lanes == 16 ? __mmask16(0xFFFF) : __mmask16((1u << lanes) - 1);
    const __m512 v = bias ? _mm512_add_ps(sums, _mm512_maskz_loadu_ps(mask, bias + c)) : sums;
    if (as_float) {
      _mm512_mask_storeu_ps(yf + row * n + c, mask, v);
    } else {  // rounded 16 lanes at a time (one by one, c10::BFloat16 took ~15% of a one-row step)
      _mm256_mask_storeu_epi16(yb + row * n + c, mask, frame_cpu::narrow16(v));
    }
  }

  // Row `row` of y, columns c..c+15: silu(gate) * up of the gate group's and the up group's sums.
  void store_gated(__m512 gate, __m512 up, int64_t row, int64_t c) const {
    if (bias) {
      gate = _mm512_add_ps(gate, _mm512_loadu_ps(bias + c));
      up = _mm512_add_ps(up, _mm512_loadu_ps(bias + width + c));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(yb + row * width + c),
                        frame_cpu::swiglu16(frame_cpu::round_to_bf16(gate), frame_cpu::round_to_bf16(up)));
  }

  // Units [begin, end) of y from x quantized as `xq`.
  void run(int64_t begin, int64_t end, const QuantizedView& xq) const {
    const RepackedSets w = sets();
    if (m == 1) {  // a decode row: its groups a set at a time
      with_repacked_format(format, [&](auto f) {
        constexpr int64_t F = decltype(f)::value;
        if (gated) {
          gated_sets_vnni<F>(w, xq, half, begin, end,
                             [&](const __m512* gate, const __m512* up, int64_t p, int count) {
                               for (int i = 0; i < count; ++i) store_gated(gate[i], up[i], 0, (p + i) * 16);
                             });
        } else {
          group_sets_vnni<F>(w, xq, begin, end,
                             [&](const __m512* sums, int64_t g, int count) {
                               for (int i = 0; i < count; ++i) store(sums[i], 0, (g + i) * 16);
                             });
        }
      });
      return;
    }
    if (m <= kVnniRows) {  // a few decode rows: whole sets as one stream each, the groups around them alone
      __m512 acc[kVnniRows * kSetGroups], up[kVnniRows * kSetGroups];
      const int rows = static_cast<int>(m);
      for (int64_t g = begin; g < end;) {
        const bool whole = w.whole_set(g, end) && (!gated || w.whole_set(half + g, half + end));
        const int count = whole ? kSetGroups : 1;
        with_repacked_format(format, [&](auto f) {
          constexpr int64_t F = decltype(f)::value;
          groups_vnni<F>(w, g, xq, 0, rows, k, acc, whole);
          if (gated) groups_vnni<F>(w, half + g, xq, 0, rows, k, up, whole);
        });
        for (int i = 0; i < count; ++i)
          for (int r = 0; r < rows; ++r) {
            if (gated) store_gated(acc[i * rows + r], up[i * rows + r], r, (g + i) * 16);
            else store(acc[i * rows + r], r, (g + i) * 16);
          }
        g += count;
      }
      return;
    }
    __m512 acc[kVnniRows], up[kVnniRows];
    for (int64_t g = begin; g < end; ++g) {
      // Later row tiles find the group's weight (at most ~20 KB) in L1/L2.
      for (int64_t r0 = 0; r0 < m; r0 += kVnniRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kVnniRows, m - r0));
        with_repacked_format(format, [&](auto f) {
          constexpr int64_t F = decltype(f)::value;
          groups_vnni<F>(w, g, xq, r0, rows, k, acc);
          if (gated) groups_vnni<F>(w, half + g, xq, r0, rows, k, up);
        });
        for (int r = 0; r < rows; ++r) {
          if (gated) store_gated(acc[r], up[r], r0 + r, g * 16);
          else store(acc[r], r0 + r, g * 16);
        }
      }
    }
  }
#else
  // Row `row` of y, columns c..c+7 (fewer past out_features): 8 sums plus the bias.
  void store8(__m256 sums, int64_t row, int64_t c) const {
    alignas(32) float v[8];
    _mm256_store_ps(v, sums);
    const int64_t lanes = std::min<int64_t>(8, n - c);
    for (int64_t j = 0; j < lanes; ++j) {
      const float out = v[j] + (bias ? bias[c + j] : 0.f);
      if (as_float) yf[row * n + c + j] = out;
      else yb[row * n + c + j] = frame_cpu::float_to_bf16(out);
    }
  }

  // Groups [begin, end) of y (no gated form on this path: make_repacked refuses it). One row of x reads its
  // groups set by set, as one stream (group_avx2 with G > 1); 2-4 rows their whole sets so; more read each group's
  // blocks for up to kAvx2Rows rows at a time.
  void run(int64_t begin, int64_t end, const QuantizedView& xq) const {
    const RepackedSets w = sets();
    if (m == 1) {
      __m256 sums[2 * kSetGroups];
      for (int64_t g = begin; g < end;) {
        const GroupPlace at = w.place(g);
        const int count = static_cast<int>(std::min(end, at.set_end) - g);
        with_format(format, [&](auto f) { group_set_any_avx2<decltype(f)::value>(count, w, at, xq, sums); });
        for (int i = 0; i < count; ++i) {
          store8(sums[2 * i], 0, (g + i) * 16);
          if ((g + i) * 16 + 8 < n) store8(sums[2 * i + 1], 0, (g + i) * 16 + 8);
        }
        g += count;
      }
      return;
    }
    if (m <= kAvx2Rows) {  // a few decode rows: whole sets as one stream each, the groups around them alone
      __m256 acc[2 * kAvx2Rows * kSetGroups];
      const int rows = static_cast<int>(m);
      for (int64_t g = begin; g < end;) {
        const bool whole = w.whole_set(g, end);
        const int count = whole ? kSetGroups : 1;
        with_format(format, [&](auto f) { groups_avx2<decltype(f)::value>(w, g, xq, 0, rows, k, acc, whole); });
        for (int i = 0; i < count; ++i)
          for (int r = 0; r < rows; ++r) {
            store8(acc[2 * (rows * i + r)], r, (g + i) * 16);
            if ((g + i) * 16 + 8 < n) store8(acc[2 * (rows * i + r) + 1], r, (g + i) * 16 + 8);
          }
        g += count;
      }
      return;
    }
    __m256 acc[2 * kAvx2Rows];
    for (int64_t g = begin; g < end; ++g) {
      for (int64_t r0 = 0; r0 < m; r0 += kAvx2Rows) {
        const int rows = static_cast<int>(std::min<int64_t>(kAvx2Rows, m - r0));
        with_format(format, [&](auto f) {
          groups_avx2<decltype(f)::value>(w, g, xq, r0, rows, k, acc);
        });
        for (int r = 0; r < rows; ++r) {
          store8(acc[2 * r], r0 + r, g * 16);
          if (g * 16 + 8 < n) store8(acc[2 * r + 1], r0 + r, g * 16 + 8);
        }
      }
    }
  }
#endif
};
#endif

// Checks the operands (x contiguous, `y` [rows, out_features] of x's dtype, or [rows, out_features / 2] when
// gated) and points a Repacked at them; see repacked_product. Only references are taken, no tensor handle.
#if FRAME_GGML_REPACKED
Repacked make_repacked(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scales, int64_t format,
                       int64_t out_features, const at::Tensor* bias, bool gated, const at::Tensor& y) {
  TORCH_CHECK(format >= 0 && format < kRepackedFormats,
              "ggml_linear_repacked takes q4_0, q4_1, q8_0, q5_0, q5_1, iq4_nl, q4_K, q6_K, q5_K, q3_K, q2_K or "
              "iq4_xs");
#if !FRAME_GGML_VNNI
  TORCH_CHECK(!super_block(format), "ggml_linear_repacked reads the K-quants with AVX-512 VNNI and BW only");
#endif
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "ggml_linear_repacked takes float32 or bfloat16 x of shape [rows, in_features]");
  // A group's scale records: one per block, or per super-block of 8 blocks for the K-quants.
  const int64_t quads = quads_for(format), nscales = scale_rows_for(format), per_scale = super_block(format) ? 8 : 1;
  TORCH_CHECK(qs.scalar_type() == at::kByte && qs.is_contiguous() && qs.dim() == 5 && qs.size(2) == quads &&
                  qs.size(3) == 16 && qs.size(4) == 4 && qs.size(1) % per_scale == 0,
              "qs must be contiguous uint8 [groups, blocks, ", quads, ", 16, 4]");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 4 &&
                  scales.size(0) == qs.size(0) && scales.size(1) * per_scale == qs.size(1) &&
                  scales.size(2) == nscales && scales.size(3) == 16,
              "scales must be contiguous float16 [groups, blocks / ", per_scale, ", ", nscales, ", 16]");
  const int64_t m = x.size(0), k = x.size(1), groups = qs.size(0), nb = qs.size(1), n = out_features;
  TORCH_CHECK(k == nb * kBlock, "x has ", k, " inputs, the weight ", nb * kBlock);
  TORCH_CHECK(n > (groups - 1) * 16 && n <= groups * 16, "out_features ", n, " does not fill ", groups, " groups");
  TORCH_CHECK(!gated || (n % 32 == 0 && x.scalar_type() == at::kBFloat16),
              "ggml_swiglu_repacked takes bfloat16 x and an intermediate size that is a multiple of 16");
#if !FRAME_GGML_VNNI
  TORCH_CHECK(!gated, "ggml_swiglu_repacked needs AVX-512 VNNI and BW; on AVX2 the product and silu_and_mul run apart");
#endif
  const float* bias_ptr = bias_data(bias, n);
  const int64_t width = gated ? n / 2 : n;
  TORCH_CHECK(y.dim() == 2 && y.size(0) == m && y.size(1) == width && y.is_contiguous() &&
                  y.scalar_type() == x.scalar_type(),
              "out must be a contiguous [rows, out_features] tensor of x's dtype ([rows, intermediate] for SwiGLU)");
  const bool as_float = x.scalar_type() == at::kFloat;
  return Repacked{x.data_ptr(), qs.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>()),
                  bias_ptr, as_float ? y.data_ptr<float>() : nullptr,
                  as_float ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr<c10::BFloat16>()), m, k, n, nb, width,
                  n / 32, groups, nb * quads * 64, nb / per_scale * nscales * 16, nb / per_scale, format, gated,
                  as_float};
}

// A team's share of `product`: its rows of x quantized into the team's scratch (a decode row by every thread
// itself: a sync costs more than quantizing one row), then its units.
void team_repacked(const Repacked& product, const frame_cpu::Team& team) {
  if (product.m == 0 || product.n == 0) return;
  const int64_t m = product.m, k = product.k, nb = product.nb;
  const bool alone = m == 1;  // each thread quantizes the row for itself, in its own buffer
  const frame_cpu::Team quantizer = alone ? frame_cpu::Team{0, 1} : team;
  auto* scratch = static_cast<uint8_t*>(frame_cpu::team_scratch(quantizer, m * k + 4 * m * nb * 4 + 64));
  int8_t* q = reinterpret_cast<int8_t*>(scratch);
  float* d = reinterpret_cast<float*>(scratch + (m * k + 63) / 64 * 64);
  float* s = d + m * nb;
  int32_t* sum = reinterpret_cast<int32_t*>(s + m * nb);
  int32_t* low = sum + m * nb;
  const auto [first, last] = frame_cpu::share(m, quantizer);
  for (int64_t r = first; r < last; ++r)
    quantize_x_row(product.x, product.as_float, r, k, true, product.format, q + r * k, d + r * nb, s + r * nb,
                   sum + r * nb, low + r * nb);
  frame_cpu::team_sync(quantizer);
  const auto [begin, end] = frame_cpu::share(product.units(), team);
  if (begin < end) product.run(begin, end, QuantizedView{q, d, s, sum, low});
}
#endif

// y = x W^T (+ b) over the repacked weight (the layout above): `qs` uint8 [groups, nb, quads, 16, 4], `scales`
// float16 [groups, nb, 1 or 2, 16]; rows past out_features in the last group are padding and are not written.
// `gated`: the weight is SwiGLU's [gate | up] (out_features = 2 * intermediate, intermediate a multiple of 16, x
// bfloat16) and y = silu(gate) * up [rows, intermediate]: each pair of sums rounded to bfloat16 as the product's
// output would be, then swiglu.h's activation, so y has the bits of this product followed by silu_and_mul, without
// the twice-as-wide output and the second op. `into`: the tensor to write y into (a recorded step's planned
// buffer), else a new one.
at::Tensor repacked_product(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scales, int64_t format,
                            int64_t out_features, const c10::optional<at::Tensor>& bias, bool gated,
                            const at::Tensor* into = nullptr) {
#if FRAME_GGML_REPACKED
  TORCH_CHECK(x.dim() == 2, "ggml_linear_repacked takes float32 or bfloat16 x of shape [rows, in_features]");
  const at::Tensor xc = x.contiguous();
  const at::Tensor y = into != nullptr ? *into
                                       : at::empty({xc.size(0), gated ? out_features / 2 : out_features}, xc.options());
  const Repacked product = make_repacked(xc, qs, scales, format, out_features, bias.has_value() ? &*bias : nullptr,
                                         gated, y);
  if (product.m == 0 || product.n == 0) return y;
  const QuantizedRows xq = quantize_rows(xc, true, product.format);
  const QuantizedView view = xq;
  // Grain 1: even the smallest linear (576 x 576, 200 KB at 4.5 bits) is worth both threads at one row. A gated
  // product splits its pairs of groups (gate, up) instead.
  at::parallel_for(0, product.units(), 1, [&](int64_t begin, int64_t end) { product.run(begin, end, view); });
  return y;
#else
  TORCH_CHECK(false, "ggml_linear_repacked needs AVX2 (or AVX-512 VNNI and BW), which this build lacks");
#endif
}

at::Tensor ggml_linear_repacked(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scales, int64_t format,
                                int64_t out_features, const c10::optional<at::Tensor>& bias) {
  return repacked_product(x, qs, scales, format, out_features, bias, false);
}

// silu(gate) * up of SwiGLU's [gate | up] weight repacked (2 * intermediate outputs) for bfloat16 x.
at::Tensor ggml_swiglu_repacked(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scales, int64_t format,
                                int64_t intermediate, const c10::optional<at::Tensor>& bias) {
  return repacked_product(x, qs, scales, format, 2 * intermediate, bias, true);
}

// The `_into` forms write into `out` (what the plain form would return): a replayed step's planned buffers.
void ggml_linear_repacked_into(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scales, int64_t format,
                               int64_t out_features, const c10::optional<at::Tensor>& bias, at::Tensor& out) {
  repacked_product(x, qs, scales, format, out_features, bias, false, &out);
}

void ggml_swiglu_repacked_into(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scales, int64_t format,
                               int64_t intermediate, const c10::optional<at::Tensor>& bias, at::Tensor& out) {
  repacked_product(x, qs, scales, format, 2 * intermediate, bias, true, &out);
}

// Direct and bound forms (direct_ops.h) of the `_into` ops: arguments x, qs, scales, format, out_features
// (intermediate when gated), bias, out.
const frame_cpu::RegisterDirect direct_repacked("frame_cpu::ggml_linear_repacked_into",
                                                [](const c10::IValue* const* a) {
  ggml_linear_repacked_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toTensor(), a[3]->toInt(), a[4]->toInt(),
                            a[5]->toOptional<at::Tensor>(), frame_cpu::written(a[6]));
});
const frame_cpu::RegisterDirect direct_swiglu_repacked("frame_cpu::ggml_swiglu_repacked_into",
                                                       [](const c10::IValue* const* a) {
  ggml_swiglu_repacked_into(a[0]->toTensor(), a[1]->toTensor(), a[2]->toTensor(), a[3]->toInt(), a[4]->toInt(),
                            a[5]->toOptional<at::Tensor>(), frame_cpu::written(a[6]));
});

#if FRAME_GGML_REPACKED
Repacked repacked_of(const c10::IValue* const* a, bool gated) {
  return make_repacked(a[0]->toTensor(), a[1]->toTensor(), a[2]->toTensor(), a[3]->toInt(),
                       gated ? 2 * a[4]->toInt() : a[4]->toInt(), a[5]->isNone() ? nullptr : &a[5]->toTensor(), gated,
                       a[6]->toTensor());
}

bool bind_repacked(const c10::IValue* const* a, frame_cpu::BoundCall& call, bool gated) {
  if (!a[0]->toTensor().is_contiguous()) return false;
  call.as<Repacked>() = repacked_of(a, gated);
  call.shared = true;
  call.run = [](const frame_cpu::BoundCall& bound, const frame_cpu::Team& team) {
    team_repacked(bound.as<Repacked>(), team);
  };
  return true;
}

const frame_cpu::RegisterBind bind_linear_repacked("frame_cpu::ggml_linear_repacked_into",
    [](const c10::IValue* const* a, frame_cpu::BoundCall& call) { return bind_repacked(a, call, false); },
    frame_cpu::Stretch::kAnchors);
const frame_cpu::RegisterBind bind_swiglu_repacked("frame_cpu::ggml_swiglu_repacked_into",
    [](const c10::IValue* const* a, frame_cpu::BoundCall& call) { return bind_repacked(a, call, true); },
    frame_cpu::Stretch::kAnchors);
#endif

// True when this build reads the repacked layout: AVX-512 VNNI, or AVX2 (the CPU has it and the compiler emitted it).
bool ggml_repacked_available() {
#if FRAME_GGML_REPACKED
  return true;
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("ggml_linear(Tensor x, Tensor blocks, int format, Tensor? bias, bool portable=False) -> Tensor");
  m.def("ggml_linear_repacked(Tensor x, Tensor qs, Tensor scales, int format, int out_features, Tensor? bias) -> "
        "Tensor");
  m.def("ggml_swiglu_repacked(Tensor x, Tensor qs, Tensor scales, int format, int intermediate, Tensor? bias) -> "
        "Tensor");
  m.def("ggml_linear_repacked_into(Tensor x, Tensor qs, Tensor scales, int format, int out_features, Tensor? bias, "
        "Tensor(a!) out) -> ()");
  m.def("ggml_swiglu_repacked_into(Tensor x, Tensor qs, Tensor scales, int format, int intermediate, Tensor? bias, "
        "Tensor(a!) out) -> ()");
  m.def("ggml_repacked_available() -> bool", &ggml_repacked_available);
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) {
  m.impl("ggml_linear", &ggml_linear);
  m.impl("ggml_linear_repacked", &ggml_linear_repacked);
  m.impl("ggml_swiglu_repacked", &ggml_swiglu_repacked);
  m.impl("ggml_linear_repacked_into", &ggml_linear_repacked_into);
  m.impl("ggml_swiglu_repacked_into", &ggml_swiglu_repacked_into);
}
