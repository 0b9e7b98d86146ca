// SwiGLU's silu(gate) * up (and GeGLU's gelu_tanh(gate) * up) on float32 values that hold bfloat16 numbers,
// rounding where torch's two bfloat16 ops do (the activation's result to bfloat16, then the product). Shared by the
// standalone activations and the gate-up linears' epilogue, so the two give the same bits. And the same on float32
// values, in float32.
#pragma once

#include "bfloat16_bits.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace frame_cpu {

// Both gated activations are gate / (1 + exp(-z)): silu with z = gate, and GELU's tanh form, 0.5 x (1 + tanh(y))
// with y = sqrt(2/pi) (x + 0.044715 x^3), which is x sigmoid(2y): z = kGeluScale x (1 + kGeluCubic x^2).
constexpr float kGeluScale = 1.5957691216057308f;  // 2 sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// exp(x) for x in [-87, 88]: 2^n * exp(t), n = round(x / ln 2), degree-6 polynomial for exp(t) (relative error
// about 1e-7, so silu's bfloat16 result may land one step from torch's now and then).
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f;
  const float t = x - n * 0.6931471805599453f;
  float p = 1.0f / 720.0f;
  p = p * t + 1.0f / 120.0f;
  p = p * t + 1.0f / 24.0f;
  p = p * t + 1.0f / 6.0f;
  p = p * t + 0.5f;
  p = p * t + 1.0f;
  p = p * t + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

#if FRAME_AVX512_BF16_BITS
// The same steps as the scalar exp_approx, sixteen lanes at a time.
inline __m512 exp_approx(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 shifter = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.4426950408889634f), shifter), shifter);
  const __m512 t = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.6931471805599453f), x);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// act(gate) * up for sixteen values that are already bfloat16 numbers (act: silu, or with Gelu GELU's tanh form;
// see kGeluScale); the result as bfloat16 bits.
template <bool Gelu = false>
inline __m256i gated16(__m512 gate, __m512 up) {
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 z = gate;
  if constexpr (Gelu) {
    const __m512 cubic = _mm512_fmadd_ps(_mm512_mul_ps(gate, gate), _mm512_set1_ps(kGeluCubic), one);
    z = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(kGeluScale), gate), cubic);
  }
  const __m512 act = _mm512_div_ps(gate, _mm512_add_ps(one, exp_approx(_mm512_sub_ps(_mm512_setzero_ps(), z))));
  return narrow16(_mm512_mul_ps(round_to_bf16(act), up));
}

// SwiGLU's silu(gate) * up, the linears' epilogue.
inline __m256i swiglu16(__m512 gate, __m512 up) { return gated16<false>(gate, up); }
#endif

#if defined(__AVX2__) && defined(__FMA__)
// The same steps as the scalar exp_approx, eight lanes at a time (AVX2).
inline __m256 exp_approx8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 shifter = _mm256_set1_ps(12582912.0f);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.4426950408889634f), shifter), shifter);
  const __m256 t = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.6931471805599453f), x);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

// act(gate) for one float32 value (act as gated16's).
template <bool Gelu>
inline float gate_act(float g) {
  const float z = Gelu ? kGeluScale * g * (1.0f + kGeluCubic * g * g) : g;
  return g / (1.0f + exp_approx(-z));
}

// act(gate) * up for float32 values, in float32 (F.silu(gate) * up; with Gelu, GeGLU's).
template <bool Gelu>
inline void gated_f32(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    __m256 z = g;
    if constexpr (Gelu) {
      const __m256 cubic = _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(kGeluCubic), one);
      z = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(kGeluScale), g), cubic);
    }
    const __m256 act = _mm256_div_ps(g, _mm256_add_ps(one, exp_approx8(_mm256_sub_ps(_mm256_setzero_ps(), z))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(act, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) out[i] = gate_act<Gelu>(gate[i]) * up[i];
}

}  // namespace frame_cpu
