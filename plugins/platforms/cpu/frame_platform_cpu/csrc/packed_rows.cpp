// Rows of a table kept in ggml's blocks (a GGUF's token embedding), dequantized for the ids a step looks up:
// packed_rows(blocks, ids, format, dtype) is F.embedding(ids, dequantize(blocks)) without the dense table, and one
// op call, so a recorded decode step can repeat it (the Python reference reads the ids back and goes through numpy).
//
// Each value is gguf's own dequantization (gguf-py's numpy dequantize_blocks), operation for operation in float32:
//   q4_0 d (u - 8), q4_1 d u + m, q8_0 d u, q5_0 d (u - 16), q5_1 d u + m, iq4_nl d kvalues[u];
//   per 16 values of a super-block, dl = d sc, then q4_K, q5_K, q2_K dl u - dmin mn, q6_K dl (u - 32),
//   q3_K dl (u - 4), iq4_xs dl kvalues[u];
// then rounded once to the table's dtype, as torch's .to() rounds, so a row equals the reference's bit for bit. The
// integers u, sc and mn come from the kernels' own block readers (ggml_blocks.h, kquant_blocks.h), plain C++: a
// lookup dequantizes a few rows a step, too little for vector code to matter. Rows are split over torch's threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "ggml_blocks.h"
#include "kquant_blocks.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {

// out[i] = scale * (u[i] - offset), plus `add` where the format has an m (or a min, -dmin mn). Every product here is
// exact in float32 (d, a float16, has 11 significant bits, a scale at most 7 and a value at most 7: never more than
// float32's 24), so only the sum rounds, once, as in gguf's numpy, and a fused multiply-add the compiler may make of
// it rounds the same sum the same way. Formats without one add nothing (not 0, which would turn -0 into +0).
template <bool Add>
void scaled(const int32_t* u, int n, float scale, int32_t offset, float add, float* out) {
  for (int i = 0; i < n; ++i) {
    const float w = scale * static_cast<float>(u[i] - offset);
    out[i] = Add ? w + add : w;
  }
}

// One row of blocks of 32 (ggml_blocks::Format) into `in` floats.
void ggml_row(int64_t format, const uint8_t* row, int64_t in, float* out) {
  using namespace ggml_blocks;
  const int64_t bytes = block_bytes(format);
  int32_t u[32];
  for (int64_t b = 0; b < in / 32; ++b) {
    const uint8_t* blk = row + b * bytes;
    values_portable(format, blk, u);
    const float d = half_at(blk);
    if (has_min(format)) scaled<true>(u, 32, d, 0, half_at(blk + 2), out + 32 * b);
    else scaled<false>(u, 32, d, offset_of(format), 0.f, out + 32 * b);
  }
}

// One row of super-blocks of 256 (kquant_blocks::Format) into `in` floats.
template <int64_t Format>
void kquant_row(const uint8_t* row, int64_t in, float* out) {
  using namespace kquant_blocks;
  constexpr bool mins = Format == kQ4_K || Format == kQ5_K || Format == kQ2_K;
  constexpr int32_t offset = Format == kQ6_K ? 32 : Format == kQ3_K ? 4 : 0;
  int8_t u8[kSuper];
  int32_t u[kSuper];
  for (int64_t b = 0; b < in / kSuper; ++b) {
    const uint8_t* blk = row + b * block_bytes(Format);
    const Header h = header<Format>(blk);
    values_portable<Format>(blk, u8);
    for (int i = 0; i < kSuper; ++i) u[i] = u8[i];  // below 64, or iq4_xs's signed levels
    for (int c = 0; c < 16; ++c) {
      const float dl = h.d * static_cast<float>(sc_of<Format>(h, c));
      const float ml = mins ? h.md * static_cast<float>(mn_of<Format>(h, c)) : 0.f;
      scaled<mins>(u + 16 * c, 16, dl, offset, -ml, out + kSuper * b + 16 * c);
    }
  }
}

// Format names as frame.interfaces.quantization.FORMATS spells them: (is a super-block format, its number).
std::pair<bool, int64_t> parse_format(const std::string& name) {
  static const char* ggml[] = {"q4_0", "q4_1", "q8_0", "q5_0", "q5_1", "iq4_nl"};
  static const char* kquant[] = {"q4_k", "q6_k", "q3_k", "q2_k", "q5_k", "iq4_xs"};
  for (int64_t i = 0; i < 6; ++i) {
    if (name == ggml[i]) return {false, i};
    if (name == kquant[i]) return {true, i};
  }
  TORCH_CHECK(false, "packed_rows reads q4_0, q4_1, q8_0, q5_0, q5_1, iq4_nl, q4_k, q6_k, q3_k, q2_k, q5_k or iq4_xs "
              "blocks, not ", name);
}

at::Tensor packed_rows(const at::Tensor& blocks, const at::Tensor& ids, c10::string_view format,
                       at::ScalarType dtype) {
  const auto [super, fmt] = parse_format(std::string(format));
  const int64_t per = super ? kquant_blocks::kSuper : 32;
  const int64_t bytes = super ? kquant_blocks::block_bytes(fmt) : ggml_blocks::block_bytes(fmt);
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.stride(1) == 1 &&
                  blocks.size(1) % bytes == 0,
              "packed_rows takes the table's blocks as uint8 [rows, row bytes] of whole ", format, " blocks, rows "
              "contiguous");
  TORCH_CHECK(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt, "packed_rows takes int64 or int32 ids");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "packed_rows gives float32, bfloat16 or float16 rows");
  const at::Tensor flat = ids.contiguous().to(at::kLong).reshape({-1});
  const int64_t n = flat.numel(), rows = blocks.size(0), in = blocks.size(1) / bytes * per;
  const int64_t* id = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < rows, "packed_rows: id ", id[i], " is outside the table's ", rows, " rows");
  at::Tensor out = at::empty({n, in}, blocks.options().dtype(dtype));
  if (n == 0 || in == 0) return out;
  const uint8_t* base = blocks.data_ptr<uint8_t>();
  const int64_t pitch = blocks.stride(0);
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> values(dtype == at::kFloat ? 0 : in);
    for (int64_t r = begin; r < end; ++r) {
      float* dst = dtype == at::kFloat ? out.data_ptr<float>() + r * in : values.data();
      const uint8_t* row = base + id[r] * pitch;
      if (super) kquant_blocks::with_format(fmt, [&](auto f) { kquant_row<decltype(f)::value>(row, in, dst); });
      else ggml_row(fmt, row, in, dst);
      if (dtype == at::kBFloat16) {
        c10::BFloat16* o = out.data_ptr<c10::BFloat16>() + r * in;
        for (int64_t i = 0; i < in; ++i) o[i] = c10::BFloat16(values[i]);
      } else if (dtype == at::kHalf) {
        c10::Half* o = out.data_ptr<c10::Half>() + r * in;
        for (int64_t i = 0; i < in; ++i) o[i] = c10::Half(values[i]);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.def("packed_rows(Tensor blocks, Tensor ids, str format, ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(frame_cpu, CPU, m) { m.impl("packed_rows", &packed_rows); }
