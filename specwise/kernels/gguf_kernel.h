// What the GGUF kernel (gguf_linear.cpp's dispatch over the paths, gguf_quantize.h's activations) offers the
// module's other file that sees PyTorch, gguf_pass.cpp (a whole decoding pass in one call). Every function
// here runs once per call (or per thread's share of one), never per block.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <string>

#include "gguf_quantize.h"

namespace specwise_gguf {

// A kernel path's id (gguf_paths.h's Path: kScalar, kAvx2, kAvx512, kAmx) from its name; checks the CPU can run it.
int64_t parse_path(const std::string& path);

// Values and bytes per block of a ggml type (0 for a type the kernel does not run).
int64_t block_values(int64_t type);
int64_t block_bytes(int64_t type);

// y[r * ldy + o] = row o of the weight (from w, row_bytes per row, nb blocks) . activation row r, for
// o in [o0, o1) and r in [0, nrows), any nrows, on the calling thread. Bit-identical to gguf_linear.
void dot_rows(int64_t path, int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
              const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy);

// Registers the decoding pass (gguf_pass.cpp) in the module.
void bind_pass(pybind11::module& m);

}  // namespace specwise_gguf
