// The decoder pass's element-wise and attention kernels in portable C++ (gguf_pass_kernels.h): the scalar
// path's, and any path's where a size is not a multiple of 8. No target pragma.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "gguf_pass_kernels.h"

namespace specwise_pass::scalar {

namespace {

float dot(const float* x, const float* y, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

void attend(const float* q, const float* keys, const float* values, const int32_t* rows, int64_t count, int64_t d,
            float scale, float cap, float* scores, float* out) {
  float top = -INFINITY, total = 0.f;
  for (int64_t j = 0; j < count; ++j) {
    scores[j] = dot(q, keys + rows[j] * d, d) * scale;
    if (cap > 0.f) scores[j] = std::tanh(scores[j] / cap) * cap;
    top = std::max(top, scores[j]);
  }
  for (int64_t j = 0; j < count; ++j) total += scores[j] = std::exp(scores[j] - top);
  const float inv = 1.f / total;
  for (int64_t i = 0; i < d; ++i) {
    float acc = 0.f;
    for (int64_t k = 0; k < count; ++k) acc += scores[k] * values[rows[k] * d + i];
    out[i] = acc * inv;
  }
}

// out[i] = gelu_tanh(gate[i]) * up[i], as PyTorch's GELU with approximate="tanh" (Gemma's GeGLU).
void gelu_tanh_mul(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.f + std::tanh(kBeta * (g + kKappa * g * g * g))) * up[i];
  }
}


// Each query alone (its scores in its own scratch), so a batch gives each query what it gives alone.
void attend_all(Query* qs, int nq, const float* keys, const float* values, int64_t d, float scale, float cap) {
  for (int b = 0; b < nq; ++b)
    attend(qs[b].q, keys, values, qs[b].rows, qs[b].count, d, scale, cap, qs[b].scores, qs[b].out);
}

}  // namespace

const Kernels kernels = {rms_norm, silu_mul, gelu_tanh_mul, attend_all};

}  // namespace specwise_pass::scalar
