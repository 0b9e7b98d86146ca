// Each row's argmax of float32 logits [rows, vocab], written into an int64 [rows]: a greedy step's tokens, taken
// inside the recorded decode step right after the output projection (the platform's greedy kernel, platform.py).
//
// The answer is numpy's: the first maximum, or the first NaN where a row has one. One pass keeps, per vector lane,
// the largest value seen and where (a strictly greater value replaces it, so a lane keeps its first maximum); the
// lanes then give the largest value and, among the lanes holding it, the smallest index. A NaN never compares
// greater, so NaNs are noted on the way and a row with one is scanned again for the first.
//
// Warm, a 49,152-wide row takes 3-4 us here as in numpy (Zen 4; torch's argmax took 43). What it saves is the path
// around it: inside the recorded step it is one direct call, where the sampler's numpy call from Python ran cold
// once a token, after the step's weights had streamed through the caches (55-70 us).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "direct_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(x[i])) return i;
  return -1;
}

int64_t argmax_scalar(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (std::isnan(x[i])) return std::isnan(x[best]) ? best : i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// Four sets of lanes take four vectors a step, so the compare-and-keep chains of the sets overlap: one set alone
// waits on its own last compare at every vector and ran at a third of this speed.
constexpr int kSets = 4;

#if defined(__AVX512F__)
int64_t argmax_row(const float* x, int64_t n) {
  if (n < 16 * kSets) return argmax_scalar(x, n);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 best[kSets];
  __m512i where[kSets];
  __mmask16 nan = 0;
  auto take = [&](int set, __m512 v, int64_t column) __attribute__((always_inline)) {
    const __mmask16 greater = _mm512_cmp_ps_mask(v, best[set], _CMP_GT_OQ);
    best[set] = _mm512_mask_mov_ps(best[set], greater, v);
    where[set] = _mm512_mask_mov_epi32(where[set], greater,
                                       _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(column))));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  };
  for (int set = 0; set < kSets; ++set) {
    best[set] = _mm512_loadu_ps(x + 16 * set);
    where[set] = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * set));
    nan |= _mm512_cmp_ps_mask(best[set], best[set], _CMP_UNORD_Q);
  }
  int64_t i = 16 * kSets;
  for (; i + 16 * kSets <= n; i += 16 * kSets)
#pragma GCC unroll 4
    for (int set = 0; set < kSets; ++set) take(set, _mm512_loadu_ps(x + i + 16 * set), i + 16 * set);
  for (; i + 16 <= n; i += 16) take(0, _mm512_loadu_ps(x + i), i);
  if (i < n) {  // the tail: absent lanes read as -inf, which never compares greater
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    take(0, _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), tail, x + i), i);
  }
  if (nan) return first_nan(x, n);
  float top = _mm512_reduce_max_ps(best[0]);
  for (int set = 1; set < kSets; ++set) top = std::max(top, _mm512_reduce_max_ps(best[set]));
  int64_t answer = n;
  for (int set = 0; set < kSets; ++set) {
    const __mmask16 holders = _mm512_cmp_ps_mask(best[set], _mm512_set1_ps(top), _CMP_EQ_OQ);
    if (holders) answer = std::min<int64_t>(answer, _mm512_mask_reduce_min_epi32(holders, where[set]));
  }
  return answer;
}
#elif defined(__AVX2__)
int64_t argmax_row(const float* x, int64_t n) {
  if (n < 8 * kSets) return argmax_scalar(x, n);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 best[kSets];
  __m256i where[kSets];
  __m256 nan = _mm256_setzero_ps();
  for (int set = 0; set < kSets; ++set) {
    best[set] = _mm256_loadu_ps(x + 8 * set);
    where[set] = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * set));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(best[set], best[set], _CMP_UNORD_Q));
  }
  int64_t i = 8 * kSets;
  for (; i + 8 * kSets <= n; i += 8 * kSets)
#pragma GCC unroll 4
    for (int set = 0; set < kSets; ++set) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * set);
      const __m256 greater = _mm256_cmp_ps(v, best[set], _CMP_GT_OQ);
      const __m256i columns = _mm256_add_epi32(iota, _mm256_set1_epi32(static_cast<int32_t>(i + 8 * set)));
      best[set] = _mm256_blendv_ps(best[set], v, greater);
      where[set] = _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(where[set]), _mm256_castsi256_ps(columns), greater));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
  if (_mm256_movemask_ps(nan)) return first_nan(x, n);
  alignas(32) float values[kSets][8];
  alignas(32) int32_t indices[kSets][8];
  for (int set = 0; set < kSets; ++set) {
    _mm256_store_ps(values[set], best[set]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(indices[set]), where[set]);
  }
  float top = values[0][0];
  int64_t answer = indices[0][0];
  for (int set = 0; set < kSets; ++set)
    for (int lane = 0; lane < 8; ++lane) {
      const float v = values[set][lane];
      if (v > top || (v == top && indices[set][lane] < answer)) top = v, answer = indices[set][lane];
    }
  for (; i < n; ++i) {  // the rest, after every earlier column
    if (std::isnan(x[i])) return i;
    if (x[i] > top) top = x[i], answer = i;
  }
  return answer;
}
#else
int64_t argmax_row(const float* x, int64_t n) { return argmax_scalar(x, n); }
#endif

void check_argmax(const at::Tensor& logits, const at::Tensor& out) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2 && logits.size(1) > 0,
              "row_argmax_into takes float32 logits of shape [rows, vocab]");
  TORCH_CHECK(out.scalar_type() == at::kLong && out.dim() == 1 && out.size(0) == logits.size(0) &&
                  out.is_contiguous(), "out must be a contiguous int64 tensor of one entry a row");
  TORCH_CHECK(logits.stride(1) == 1, "row_argmax_into takes rows with contiguous columns");
}

void argmax_rows(const at::Tensor& logits, const at::Tensor& out, int64_t begin, int64_t end) {
  const float* x = logits.data_ptr<float>();
  int64_t* y = out.data_ptr<int64_t>();
  for (int64_t r = begin; r < end; ++r) y[r] = argmax_row(x + r * logits.stride(0), logits.size(1));
}

void row_argmax_into(const at::Tensor& logits, at::Tensor& out) {
  check_argmax(logits, out);
  // A row takes about 3 us: a step of a few rows runs on the calling thread, with no parallel region to wake.
  at::parallel_for(0, logits.size(0), 8, [&](int64_t begin, int64_t end) { argmax_rows(logits, out, begin, end); });
}

const frame_cpu::RegisterDirect direct_argmax("frame_cpu::row_argmax_into", [](const c10::IValue* const* a) {
  row_argmax_into(a[0]->toTensor(), frame_cpu::written(a[1]));
});

// The bound form (direct_ops.h): the checked pointers, each thread of a team taking its share of the rows.
struct BoundArgmax {
  const float* logits;
  int64_t* out;
  int64_t rows, stride, columns;
};

const frame_cpu::RegisterBind bind_argmax("frame_cpu::row_argmax_into",
                                          [](const c10::IValue* const* a, frame_cpu::BoundCall& call) {
  const at::Tensor &logits = a[0]->toTensor(), &out = a[1]->toTensor();
  check_argmax(logits, out);
  call.as<BoundArgmax>() = BoundArgmax{logits.data_ptr<float>(), out.data_ptr<int64_t>(), logits.size(0),
                                       logits.stride(0), logits.size(1)};
  call.shared = true;
  call.run = [](const frame_cpu::BoundCall& bound, const frame_cpu::Team& team) {
    const BoundArgmax& b = bound.as<BoundArgmax>();
    const auto [begin, end] = frame_cpu::share(b.rows, team);
    for (int64_t r = begin; r < end; ++r) b.out[r] = argmax_row(b.logits + r * b.stride, b.columns);
  };
  return true;
}, frame_cpu::Stretch::kAnchors);

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) { m.def("row_argmax_into(Tensor logits, Tensor(a!) out) -> ()"); }

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) { m.impl("row_argmax_into", &row_argmax_into); }
