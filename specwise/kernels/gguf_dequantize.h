// The dequantizers' entry points (gguf_dequantize.cpp), one weight row at a time, for gguf_linear.cpp's entry
// points, which split the rows over threads. No PyTorch here: gguf_dequantize.cpp compiles without it.
#pragma once

#include <cstdint>

namespace specwise_gguf {

// One row of nb blocks of `type` as float32 into dst, with the same float32 operations in the same order as
// gguf's reference dequantizer.
void dequantize_row(int64_t type, const uint8_t* row, int64_t nb, float* dst);

// Whether dequantize_row_bf16 can take its AVX-512 BF16 code for `type` on this CPU.
bool dequantize_bf16_simd(int64_t type);

// The same row as bfloat16 into dst (each value dequantized in float32, then rounded to nearest even): with
// `simd` (see dequantize_bf16_simd) by the AVX-512 BF16 code, else by dequantize_row into scratch (room for
// the row's values) and rounding.
void dequantize_row_bf16(int64_t type, const uint8_t* row, int64_t nb, bool simd, float* scratch, uint16_t* dst);

}  // namespace specwise_gguf
