// The optional bias of the packed linears: float32 with out_features elements, or none.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

// The bias's data, or nullptr when there is none (a null or undefined `bias`); one clear error for a bias of the
// wrong type or size. Takes no tensor handle, so a team's threads may all call it.
inline const float* bias_data(const at::Tensor* bias, int64_t out_features) {
  if (bias == nullptr || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out_features,
              "bias must be float32 with out_features elements");
  return bias->data_ptr<float>();
}

inline const float* bias_data(const c10::optional<at::Tensor>& bias, int64_t out_features) {
  return bias_data(bias.has_value() ? &*bias : nullptr, out_features);
}
