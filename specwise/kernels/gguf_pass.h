// The compiled decoder pass's model and one pass's rows, as gguf_pass.cpp (the module's DecoderPass: its
// layers, the checks of each call's arguments) hands them to gguf_pass_layers.cpp (the layer loop).
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <vector>

#include "gguf_kernel.h"

namespace specwise_pass {

constexpr int kKinds = specwise_gguf::kActivationKinds;  // activation layouts (gguf_quantize.h)

// One stored weight whose outputs are a slice of a projection's outputs.
struct Part {
  torch::Tensor weight, bias;  // uint8 [out, row bytes]; float32 [out] or undefined
  int64_t type, out, row_bytes, nb;
};

// Parts side by side: outputs [part 0 | part 1 | ...], all reading one input of `in` features.
struct Proj {
  std::vector<Part> parts;
  int64_t in = 0, out = 0, bytes = 0;
  bool kinds[kKinds] = {};
};

struct Layer {
  torch::Tensor input_norm, post_norm;  // float32 [hidden]
  Proj qkv, o, gate_up, down;
  torch::Tensor q_norm, k_norm;              // float32 [head_dim], or undefined: no per-head norm
  torch::Tensor attn_out_norm, mlp_out_norm;  // float32 [hidden], or undefined: the output goes to the residual
  int64_t window = 0;                         // > 0: a row attends to its last `window` visible entries only
  int64_t rope = 0;                           // which rotary table (cos/sin [tables, n, head_dim]) it reads
};

// The MLP's activation; the codes are those runners/native_pass.py passes (its _ACTIVATIONS).
enum Activation : int64_t { kSilu = 0, kGeluTanh = 1 };

struct Model {
  int64_t hidden, heads, kv_heads, head_dim, intermediate;
  float eps;
  int64_t activation;             // Activation
  float attention_scale, softcap;  // multiplies q . k (0: 1 / sqrt(head_dim)); > 0: caps scores at cap * tanh(s / cap)
  std::vector<Layer> layers;
};

// Where one row's keys and values live: its sequence's cache, that cache's capacity, and the row's slot.
struct RowCache {
  float* keys;
  float* values;
  int64_t capacity, slot;
};

// One pass's rows, checked (gguf_pass.cpp): n > 0 rows, each seeing at least one slot.
struct Rows {
  int64_t n;
  float* hidden;                                 // [n, hidden] float32, updated in place
  const std::vector<RowCache>& caches;           // per row
  const std::vector<std::vector<int32_t>>& seen;  // per row: the slots it attends to, ascending
  const float* cos;                              // [tables, n, head_dim]
  const float* sin;
  float* captured;                               // [n, captures, hidden], or null
  int64_t captures;
  const std::vector<int64_t>& capture_at;        // per layer: its place in captured, or -1
};

// Layers [first, last) of the model over the rows, on kernel path `path` (gguf_paths.h's Path).
void run_layers(const Model& model, const Rows& rows, int64_t first, int64_t last, int64_t path);

}  // namespace specwise_pass
