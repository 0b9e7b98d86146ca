// y = x W^T (+ b) for a weight kept in ggml's packed blocks (q4_0, q4_1, q8_0, exactly as a GGUF file stores
// them: FORMATS in frame.interfaces.quantization), float32 or bfloat16 x: the linears of a GGUF model served
// with `--quantization gguf`.
//
// The weight is never expanded in memory. Each row of x is first quantized per block of 32 inputs to int8 with
// one float32 scale d_x = max|x| / 127 (and s_x = d_x * sum(q_x)), as llama.cpp does for its own dot products;
// a weight block is then unpacked in registers once (16 bytes of nibbles become 32 bytes) and multiplied by the
// int8 inputs of up to four rows with integer multiply-adds (`vpmaddubsw`, `vpmaddwd`), scaled once per block:
//   q4_0: w = d (q - 8)    ->  d_w (d_x sum(q q_x) - 8 s_x)
//   q4_1: w = d q + m      ->  d_w d_x sum(q q_x) + m s_x
//   q8_0: w = d q          ->  d_w d_x sum(q q_x)
// A decode step reads the weight once at 4.5-8.5 bits per value, which is what bounds it.
//
// `portable` runs the same arithmetic in plain C++ (the path of CPUs without AVX2, and its test here); both sum a
// block's 32 integer products exactly, so they differ only in the order of the float32 block sums.

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

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define FRAME_GGML_AVX2 1
#endif

namespace {

constexpr int64_t kBlock = 32;
constexpr int kRowTile = 4;  // rows of x per pass over a weight row

enum Format : int64_t { kQ4_0 = 0, kQ4_1 = 1, kQ8_0 = 2 };

int64_t block_bytes(int64_t format) { return format == kQ8_0 ? 34 : (format == kQ4_1 ? 20 : 18); }

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// x's rows quantized per block: q [m][k] int8, d and s [m][k / 32] float32.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

template <typename T>
void quantize_row(const T* x, int64_t k, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    float xs[kBlock];
    float amax = 0.f;
    for (int i = 0; i < kBlock; ++i) {
      xs[i] = static_cast<float>(x[b * kBlock + i]);
      amax = std::max(amax, std::fabs(xs[i]));
    }
    const float scale = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      const int v = static_cast<int>(std::nearbyint(xs[i] * inv));
      q[b * kBlock + i] = static_cast<int8_t>(v);
      sum += v;
    }
    d[b] = scale;
    s[b] = scale * static_cast<float>(sum);
  }
}

QuantizedRows quantize_rows(const at::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1);
  QuantizedRows out{std::vector<int8_t>(m * k), std::vector<float>(m * k / kBlock), std::vector<float>(m * k / kBlock)};
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int8_t* q = out.q.data() + r * k;
      float* d = out.d.data() + r * (k / kBlock);
      float* s = out.s.data() + r * (k / kBlock);
      if (x.scalar_type() == at::kFloat) {
        quantize_row(x.data_ptr<float>() + r * k, k, q, d, s);
      } else {
        quantize_row(x.data_ptr<c10::BFloat16>() + r * k, k, q, d, s);
      }
    }
  });
  return out;
}

// One weight row against R rows of quantized x, plain C++.
void row_portable(int64_t format, const uint8_t* w, int64_t nb, const QuantizedRows& xq, int64_t r0, int rows,
                  int64_t k, float* dots) {
  const int64_t bb = block_bytes(format);
  for (int r = 0; r < rows; ++r) {
    const int8_t* qx = xq.q.data() + (r0 + r) * k;
    const float* dx = xq.d.data() + (r0 + r) * nb;
    const float* sx = xq.s.data() + (r0 + r) * nb;
    float total = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * bb;
      const int8_t* xb = qx + b * kBlock;
      const float dw = half_at(blk);
      int dot = 0;
      if (format == kQ8_0) {
        const int8_t* qw = reinterpret_cast<const int8_t*>(blk + 2);
        for (int i = 0; i < kBlock; ++i) dot += qw[i] * xb[i];
        total += dw * dx[b] * static_cast<float>(dot);
        continue;
      }
      const uint8_t* qs = blk + (format == kQ4_1 ? 4 : 2);
      for (int i = 0; i < 16; ++i) dot += (qs[i] & 0x0F) * xb[i] + (qs[i] >> 4) * xb[i + 16];
      if (format == kQ4_1) {
        total += dw * dx[b] * static_cast<float>(dot) + half_at(blk + 2) * sx[b];
      } else {
        total += dw * (dx[b] * static_cast<float>(dot) - 8.f * sx[b]);
      }
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

// 32 nibbles as bytes: low nibbles are inputs 0-15, high nibbles 16-31.
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// sum over 32 of u[i] * s[i] as 8 int32 lanes (u unsigned bytes, s signed).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

template <int64_t Format, int R>
void row_avx2(const uint8_t* w, int64_t nb, const QuantizedRows& xq, int64_t r0, int64_t k, float* dots) {
  constexpr int64_t bb = Format == kQ8_0 ? 34 : (Format == kQ4_1 ? 20 : 18);
  __m256 acc[R];
  float corr[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    corr[r] = 0.f;
  }
  const int8_t* qx = xq.q.data() + r0 * k;
  const float* dx = xq.d.data() + r0 * nb;
  const float* sx = xq.s.data() + r0 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * bb;
    const float dw = half_at_f16c(blk);
    const float mw = Format == kQ4_1 ? half_at_f16c(blk + 2) : (Format == kQ4_0 ? -8.f * dw : 0.f);
    __m256i wq;
    if constexpr (Format == kQ8_0) {
      wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    } else {
      wq = unpack_nibbles(blk + (Format == kQ4_1 ? 4 : 2));
    }
    const __m256i wabs = Format == kQ8_0 ? _mm256_sign_epi8(wq, wq) : wq;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + r * k + b * kBlock));
      if constexpr (Format == kQ8_0) xb = _mm256_sign_epi8(xb, wq);  // the weight's sign moves onto x
      const __m256 dot = _mm256_cvtepi32_ps(dot_u8s8(wabs, xb));
      acc[r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(dw * dx[r * nb + b]), acc[r]);
      if constexpr (Format != kQ8_0) corr[r] += mw * sx[r * nb + b];  // q4_1: m s_x; q4_0: -8 d_w s_x
    }
  }
  for (int r = 0; r < R; ++r) dots[r] = hsum(acc[r]) + corr[r];
}

template <int64_t Format>
void rows_avx2(const uint8_t* w, int64_t nb, const QuantizedRows& xq, int64_t r0, int rows, int64_t k, float* dots) {
  switch (rows) {
    case 1: row_avx2<Format, 1>(w, nb, xq, r0, k, dots); break;
    case 2: row_avx2<Format, 2>(w, nb, xq, r0, k, dots); break;
    case 3: row_avx2<Format, 3>(w, nb, xq, r0, k, dots); break;
    default: row_avx2<Format, 4>(w, nb, xq, r0, k, dots); break;
  }
}
#endif

at::Tensor ggml_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                       const c10::optional<at::Tensor>& bias, bool portable) {
  TORCH_CHECK(format == kQ4_0 || format == kQ4_1 || format == kQ8_0, "ggml_linear takes q4_0, q4_1 or q8_0 blocks");
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "ggml_linear takes float32 or bfloat16 x of shape [rows, in_features]");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
              "ggml_linear takes the weight's blocks as contiguous uint8 [out_features, row bytes]");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), n = blocks.size(0), nb = k / kBlock;
  TORCH_CHECK(k % kBlock == 0 && blocks.size(1) == nb * block_bytes(format),
              "the blocks do not hold in_features = ", k, " inputs per row in this format");
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "bias must be float32 with out_features elements");
    bias_ptr = bias->data_ptr<float>();
  }
  at::Tensor y = at::empty({m, n}, xc.options());
  if (m == 0 || n == 0) return y;
  const QuantizedRows xq = quantize_rows(xc);
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
          if (format == kQ4_0) rows_avx2<kQ4_0>(w, nb, xq, r0, rows, k, dots);
          else if (format == kQ4_1) rows_avx2<kQ4_1>(w, nb, xq, r0, rows, k, dots);
          else rows_avx2<kQ8_0>(w, nb, xq, r0, rows, k, dots);
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("ggml_linear(Tensor x, Tensor blocks, int format, Tensor? bias, bool portable=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) { m.impl("ggml_linear", &ggml_linear); }
