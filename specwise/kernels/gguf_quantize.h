// The activation quantizer's entry points (gguf_quantize.cpp), for the dispatch (gguf_linear.cpp) and the
// decoding pass (gguf_pass.cpp, through gguf_kernel.h). Apart from gguf_kernel.h so that gguf_quantize.cpp
// compiles without PyTorch's extension headers (it takes only ATen's thread pool). Each call quantizes whole
// rows, never a single block.
#pragma once

#include <cstdint>

namespace specwise_gguf {

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

// The same for rows [0, n), split over threads for prefill-sized inputs (what gguf_linear does).
void quantize_rows(int64_t path, int64_t type, const float* x, int64_t n, int64_t in_features, uint8_t* act,
                   int64_t stride);

}  // namespace specwise_gguf
