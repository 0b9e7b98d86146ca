// Storing a step's new K/V into the pool: copied into a float pool (already in its dtype), quantized per row into
// an int8 / fp8 one (codes, then the row's float32 scale). The `write` op, and `forward` before it attends.
#pragma once

#include "common.h"
#include "convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace frame_cpu_paged {

// True when each token's [heads, D] row is contiguous (tokens themselves may be strided, as columns of QKV).
inline bool rows_contiguous(const at::Tensor& t) {
  return t.dim() == 3 && t.stride(2) == 1 && (t.size(1) == 1 || t.stride(1) == t.size(2));
}

// Quantize one row of D values into D codes and the row's float32 scale (max |x| / qmax; 1 for a row of zeros),
// rounding as the torch reference (frame.interfaces.kv_dtype.quantize_rows) does: int8 to nearest even, fp8 by c10.
template <typename code_t, typename value_t>
void quantize_row(const value_t* x, int64_t dim, code_t* out) {
  constexpr float qmax = std::is_same_v<code_t, int8_t> ? 127.0f : 448.0f;
  float amax = 0.0f;
  for (int64_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(to_float(x[d])));
  float scale = amax / qmax;
  if (!(scale > 0.0f)) scale = 1.0f;
  for (int64_t d = 0; d < dim; ++d) {
    const float scaled = to_float(x[d]) / scale;
    if constexpr (std::is_same_v<code_t, int8_t>)
      out[d] = static_cast<int8_t>(std::clamp(std::nearbyint(scaled), -qmax, qmax));
    else
      out[d] = c10::Float8_e4m3fn(scaled);
  }
  std::memcpy(reinterpret_cast<char*>(out + dim), &scale, sizeof scale);
}

// Quantize each new token's K and V rows ([tokens, kv_heads, D], a float dtype, rows contiguous) into its slot of
// an int8 / fp8 pool ([blocks, block_size, kv_heads, D + 4]).
inline void write_quantized_slots(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache,
                                  at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  const at::Tensor kc = rows_contiguous(key) ? key : key.contiguous();
  const at::Tensor vc = rows_contiguous(value) ? value : value.contiguous();
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t tokens = kc.size(0), kv_heads = kc.size(1), dim = kc.size(2), row = dim + kScaleBytes;
  const int64_t* sp = slots.data_ptr<int64_t>();
  auto store = [&](auto* ks, auto* vs, auto* kd, auto* vd) {
    const int64_t k_step = kc.stride(0), v_step = vc.stride(0);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        quantize_row(ks + t * k_step + h * dim, dim, kd + (sp[t] * kv_heads + h) * row);
        quantize_row(vs + t * v_step + h * dim, dim, vd + (sp[t] * kv_heads + h) * row);
      }
    }
  };
  auto with_codes = [&](auto* ks, auto* vs) {
    if (k_cache.scalar_type() == at::kChar)
      return store(ks, vs, k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>());
    return store(ks, vs, k_cache.data_ptr<c10::Float8_e4m3fn>(), v_cache.data_ptr<c10::Float8_e4m3fn>());
  };
  switch (kc.scalar_type()) {
    case at::kFloat: return with_codes(kc.data_ptr<float>(), vc.data_ptr<float>());
    case at::kBFloat16: return with_codes(kc.data_ptr<c10::BFloat16>(), vc.data_ptr<c10::BFloat16>());
    case at::kHalf: return with_codes(kc.data_ptr<c10::Half>(), vc.data_ptr<c10::Half>());
    default: TORCH_CHECK(false, "unsupported K/V dtype ", kc.scalar_type());  // check_kv_write refused it first
  }
}

inline bool is_quantized(const at::Tensor& cache) {
  return cache.scalar_type() == at::kChar || cache.scalar_type() == at::kFloat8_e4m3fn;
}

// Copy each new token's K and V rows ([tokens, kv_heads, D], the cache's dtype, rows contiguous) to its slot.
inline void write_slots(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache,
                        at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  const at::Tensor kc = rows_contiguous(key) ? key : key.contiguous();
  const at::Tensor vc = rows_contiguous(value) ? value : value.contiguous();
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t tokens = kc.size(0), row = kc.size(1) * kc.size(2);
  const int64_t bytes = row * kc.element_size();
  const int64_t k_step = kc.stride(0) * kc.element_size(), v_step = vc.stride(0) * vc.element_size();
  const int64_t* sp = slots.data_ptr<int64_t>();
  auto* kd = static_cast<char*>(k_cache.data_ptr());
  auto* vd = static_cast<char*>(v_cache.data_ptr());
  const auto* ks = static_cast<const char*>(kc.data_ptr());
  const auto* vs = static_cast<const char*>(vc.data_ptr());
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(kd + sp[t] * bytes, ks + t * k_step, bytes);
    std::memcpy(vd + sp[t] * bytes, vs + t * v_step, bytes);
  }
}

// Raises unless the step's new K/V ([tokens, kv_heads, D]) can be stored through slot_mapping: their dtypes, the
// pool's rows, every slot inside the pool. Separate from the stores, so that a team's threads all raise alike.
inline void check_kv_write(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "slot mapping must be int64");
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3, "new K and V must be [tokens, kv_heads, head_dim]");
  TORCH_CHECK(slot_mapping.numel() >= key.size(0), "every new token needs a slot");
  int64_t row = key.size(1) * key.size(2);
  if (is_quantized(k_cache)) {
    TORCH_CHECK(key.scalar_type() == value.scalar_type(), "new K and V must share a dtype");
    TORCH_CHECK(key.scalar_type() == at::kFloat || key.scalar_type() == at::kBFloat16 ||
                    key.scalar_type() == at::kHalf, "unsupported K/V dtype ", key.scalar_type());
    TORCH_CHECK(k_cache.size(-1) == key.size(2) + kScaleBytes && k_cache.size(-2) == key.size(1),
                "a quantized cache's rows must be head_dim + 4");
    row = key.size(1) * k_cache.size(-1);
  } else {
    TORCH_CHECK(key.scalar_type() == k_cache.scalar_type() && value.scalar_type() == v_cache.scalar_type(),
                "new K/V must be in the cache's dtype");
  }
  const int64_t num_slots = k_cache.numel() / std::max<int64_t>(row, 1);
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < key.size(0); ++t)
    TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "slot ", sp[t], " is outside the cache");
}

// Store the step's new K/V (checked by check_kv_write): copied into a float pool (already in its dtype), quantized
// into an int8 / fp8 one.
inline void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                     const at::Tensor& slot_mapping) {
  if (is_quantized(k_cache))
    write_quantized_slots(key, value, k_cache, v_cache, slot_mapping);
  else
    write_slots(key, value, k_cache, v_cache, slot_mapping);
}

// The `write` op: check, then store.
inline void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                     const at::Tensor& slot_mapping) {
  check_kv_write(key, value, k_cache, v_cache, slot_mapping);
  store_kv(key, value, k_cache, v_cache, slot_mapping);
}

}  // namespace frame_cpu_paged
