// The optional bias of the packed linears: float32 with out_features elements, or none.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

// The bias's data, or nullptr when there is none; one clear error for a bias of the wrong type or size.
inline const float* bias_data(const c10::optional<at::Tensor>& bias, int64_t out_features) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out_features,
              "bias must be float32 with out_features elements");
  return bias->data_ptr<float>();
}
