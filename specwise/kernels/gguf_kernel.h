// What gguf_linear.cpp (the block formats and their dot-product tiles) offers the other translation unit of
// the GGUF kernel module, gguf_pass.cpp (a whole decoding pass in one call).
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <string>

namespace specwise_gguf {

// Kernel paths: 0 scalar, 1 AVX2, 2 AVX-512 VNNI. parse_path checks the CPU can run the one named.
int64_t parse_path(const std::string& path);

// Values and bytes per block of a ggml type (0 for a type the kernel does not run).
int64_t block_values(int64_t type);
int64_t block_bytes(int64_t type);

// The activation layouts, kActivationKinds of them: every 256-value type (the K-quants, IQ4_XS) shares one,
// Q5_0 has its own, and Q8_0 one that the other 32-value types read too. activation_kind_type(k) is a type of
// layout k, for the functions below.
constexpr int kActivationKinds = 3;
int activation_kind(int64_t type);
int64_t activation_kind_type(int kind);

// Bytes one quantized activation row of `in_features` takes for weights of `type`.
int64_t activation_stride(int64_t type, int64_t in_features);

// Quantize rows [r0, r1) of x [*, in_features] for weights of `type` into act (64-byte aligned, `stride`
// bytes per row), on the calling thread. Exactly what gguf_linear does for the same rows.
void quantize_rows_serial(int64_t path, int64_t type, const float* x, int64_t r0, int64_t r1, int64_t in_features,
                          uint8_t* act, int64_t stride);

// y[r * ldy + o] = row o of the weight (from w, row_bytes per row, nb blocks) . activation row r, for
// o in [o0, o1) and r in [0, nrows), nrows <= 64, on the calling thread. Bit-identical to gguf_linear.
void dot_rows(int64_t path, int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
              const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy);

// Registers the decoding pass (gguf_pass.cpp) in the module.
void bind_pass(pybind11::module& m);

}  // namespace specwise_gguf
