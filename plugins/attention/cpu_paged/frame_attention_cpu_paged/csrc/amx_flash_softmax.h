// The vectors' side of the AMX flash prefill kernel (amx_prefill.h): the online softmax of a row block over a
// sub-step's transposed scores, with its lazy reference maxima, causal masking and exp2 polynomial, writing the
// probabilities as the tiles' P^T.
#pragma once

#include "amx_flash_tiles.h"
#include "amx_tiles.h"
#include "common.h"

#if FRAME_PAGED_AMX
namespace frame_cpu_paged::amx {

// 2^x for 16 lanes: 2^floor(x) * 2^f with f = x - floor(x) in [0, 1) (one vreduceps; vscalefps takes the floor
// of x itself) on a degree-3 polynomial (least-squares fit of the relative error: at most 8e-5, far below the
// bfloat16 rounding of the probabilities, 2e-3). Six instructions with the score's scaling where the degree-5
// polynomial on a rounded x took nine: the kernel ran 1.06x faster for the degree, 1.03x for vreduceps. Very
// negative x gives 0 (scalef underflows), never NaN.
inline __m512 exp2_ps(__m512 x) {
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(7.7907164e-2f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.2623319e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.957771e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.9992783e-1f));
  return _mm512_scalef_ps(p, x);
}

// The flash kernel's online softmax, on the buffers of FlashTiles.
template <int D>
class FlashSoftmax : public FlashTiles<D> {
 public:
  using bf16 = c10::BFloat16;

  explicit FlashSoftmax(const Problem<bf16, bf16>& p) : FlashTiles<D>(p) {}

 protected:
  using Base = FlashTiles<D>;
  using typename Base::Pending;
  using typename Base::TileWork;
  using Base::kKeys, Base::kLazy, Base::kResident;
  using Base::p_, Base::max_, Base::sum_, Base::pos_;
  using Base::values, Base::load_acc, Base::store_acc, Base::tile_piece;

  // The online softmax of row block b over keys [k0, k0 + n) with their scores s: P^T into pt. The probabilities
  // are first taken against the rows' reference maxima as they stand; only when some row's sum reaches 2^7 (a
  // score may then exceed its reference by the lazy margin) does a max pass decide which rows raise, and only
  // raised rows' probabilities change on the second pass (the others' bits are the first pass's). Skipping the
  // max pass in the common case made the kernel 1.06x faster. A rescale of O^T first adds the pending sub-step's
  // product (computed against the old reference).
  void softmax(int64_t b, int64_t k0, int n, const float* s, uint32_t* pt, float* acc, Pending& pending,
               TileWork* work) {
    // Scores of keys the rows cannot see (after a row's token, past the step's last key, padding rows) are masked.
    const Visible seen{_mm512_loadu_si512(pos_.data() + b * 16), k0, n,
                       n < kKeys || pos_[b * 16] < k0 + kKeys - 1};
    const __m512 c2 = _mm512_set1_ps(p_.scale * 1.4426950408889634f);
    float* max = max_.data() + b * 16;
    float* sum = sum_.data() + b * 16;
    __m512 ref = _mm512_loadu_ps(max);
    __m512 l = _mm512_loadu_ps(sum);
    __m512 total = probabilities(s, pt, _mm512_mul_ps(ref, c2), seen, work);
    // Below 2^7 in every row no score exceeds its reference by 2^7 (2^8 is the margin): no row raises.
    if (_mm512_cmp_ps_mask(total, _mm512_set1_ps(128.0f), _CMP_NLT_UQ) != 0) {
      const __m512 masked = _mm512_set1_ps(kMasked);
      __m512 top = masked;
      for (int j = 0; j < kKeys; ++j) {
        const __m512 x = _mm512_load_ps(s + 16 * j);
        top = _mm512_max_ps(top, seen.masking ? _mm512_mask_mov_ps(masked, seen(j), x) : x);
      }
      const __mmask16 raise = _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_sub_ps(top, ref), c2),
                                                 _mm512_set1_ps(kLazy), _CMP_GT_OQ);
      if (raise) {
        const __m512 next = _mm512_mask_mov_ps(ref, raise, top);
        // Exactly 1 in the lanes not raised (exp2_ps(0) is its polynomial's 0.99993): a row's sums must not depend
        // on whether another row of its block raised, or on which rows share its block.
        const __m512 correction = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), raise,
                                                     exp2_ps(_mm512_mul_ps(_mm512_sub_ps(ref, next), c2)));
        l = _mm512_mul_ps(l, correction);
        // Rows that saw keys before hold sums to rescale; rows that saw none hold zeros.
        if (_mm512_mask_cmp_ps_mask(raise, ref, _mm512_set1_ps(0.5f * kMasked), _CMP_GT_OQ)) {
          values(pending, acc);
          if constexpr (kResident) store_acc(acc);
          for (int d = 0; d < D; ++d)
            _mm512_storeu_ps(acc + 16 * d, _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * d), correction));
          if constexpr (kResident) load_acc(acc);
        }
        ref = next;
        _mm512_storeu_ps(max, ref);
        total = probabilities(s, pt, _mm512_mul_ps(ref, c2), seen, nullptr);
      }
    }
    _mm512_storeu_ps(sum, _mm512_add_ps(l, total));
  }

  // Which of a row block's rows see key k0 + j of a sub-step's n (masking false: all of them, every key).
  struct Visible {
    __m512i pos;
    int64_t k0;
    int n;
    bool masking;
    __mmask16 operator()(int j) const {
      return j < n ? _mm512_cmpge_epi32_mask(pos, _mm512_set1_epi32(static_cast<int32_t>(k0 + j))) : 0;
    }
  };

  // exp2(s * c2 - offset) of a sub-step's scores into P^T (pt, bfloat16 key pairs), returning each row's sum.
  __m512 probabilities(const float* s, uint32_t* pt, __m512 offset, const Visible& seen, TileWork* work) const {
    const __m512 c2 = _mm512_set1_ps(p_.scale * 1.4426950408889634f);
    // Key pair k's probabilities interleaved per row: (p[2k][row], p[2k + 1][row]), P^T as the tiles read it.
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 total = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int k = 0; k < kKeys / 2; ++k) {
      if (work != nullptr) tile_piece(k, *work);
      __m512 p0 = exp2_ps(_mm512_fmsub_ps(_mm512_load_ps(s + 32 * k), c2, offset));
      __m512 p1 = exp2_ps(_mm512_fmsub_ps(_mm512_load_ps(s + 32 * k + 16), c2, offset));
      if (seen.masking) {  // masked scores may be anything (NaN from a pool slot past the sequence): zero them here
        p0 = _mm512_maskz_mov_ps(seen(2 * k), p0);
        p1 = _mm512_maskz_mov_ps(seen(2 * k + 1), p1);
      }
      total = _mm512_add_ps(total, _mm512_add_ps(p0, p1));
      const __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);  // p0's 16 values, then p1's
      _mm512_store_si512(pt + 16 * k, _mm512_permutexvar_epi16(interleave, pair));
    }
    return total;
  }
};

}  // namespace frame_cpu_paged::amx
#endif
