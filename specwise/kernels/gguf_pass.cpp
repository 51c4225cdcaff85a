// One decoding pass through every decoder layer of a GGUF model (specwise/models/architectures.py), in one call.
//
// Why: a pass over a few rows costs ~30 ms of weight reading on two cores, but run as ~20 PyTorch ops and
// 4 kernel calls per layer it also pays several milliseconds of dispatch, allocation and thread wake-ups
// (docs/DESIGN.md, "Cost model"). Here the threads enter one OpenMP region per pass and meet at barriers.
//
// What, per layer: RMSNorm, the fused q/k/v projection (+ bias), [RMSNorm of each q and k head,] rotary
// embedding (the layer's table), the cache write, attention (the model's scale, [soft-capped scores,] [the
// layer's sliding window]), the output projection, [RMSNorm,] the residual, RMSNorm, the fused gate/up
// projection, SiLU(gate) * up or GELU-tanh(gate) * up, the down projection, [RMSNorm,] the residual. The
// bracketed steps are an architecture's (Qwen3, Gemma 2/3); a Llama/Qwen2 layer runs without them, exactly
// as it always has. The projections are the kernel's tiles (gguf_avx512.cpp, gguf_avx2.cpp,
// gguf_scalar.cpp) on the same int8 activations, so they give the same values as gguf_linear.
//
// Row independence (docs/DESIGN.md, "Numerics"): every row goes through the same operations in the same
// order whatever the other rows of the pass: norms, rotary and SiLU per row; each (row, head) attends to
// exactly the cache entries its row may see, in cache order, with fixed-order sums; threads split output
// features, heads and rows, never one sum. So a row's hidden states, and its logits, are bit-identical
// to a pass holding that row alone: what makes speculative output equal plain decoding token for token.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gguf_kernel.h"

namespace {

using specwise_gguf::activation_stride;
using specwise_gguf::block_bytes;
using specwise_gguf::block_values;

constexpr int kKinds = specwise_gguf::kActivationKinds;  // activation layouts (gguf_kernel.h)
constexpr int kBatch = 16;  // query heads per attend_batch call

int kind_of(int64_t type) { return specwise_gguf::activation_kind(type); }
int64_t kind_type(int kind) { return specwise_gguf::activation_kind_type(kind); }

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

enum Activation : int64_t { kSilu = 0, kGeluTanh = 1 };

// ---------------------------------------------------------------------------------------------
// Element-wise pieces: an AVX2 version (every x86-64 CPU the SIMD kernel paths run on) and a scalar one;
// attention's sums also in 512-bit registers (simd512, defined below), for the AVX-512 paths.

namespace simd512 {
bool usable();
void scores(const float* q, const float* keys, const int32_t* rows, int64_t j0, int64_t j1, int64_t d, float scale,
            float* out);
void add_values(const float* scores, const float* values, const int32_t* rows, int64_t k0, int64_t k1, int64_t d,
                float* acc);
}  // namespace simd512

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace simd {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// e^x to about 1 ulp (Cephes' polynomial after a reduction by ln 2); inputs are clamped to [-88.38, 88.38].
inline __m256 exp(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)), _mm256_set1_ps(88.3762626647949f));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Sum of x*y over n values (n a multiple of 8), in a fixed order.
inline float dot(const float* x, const float* y, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
  }
  if (i < n) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
  return hsum(_mm256_add_ps(a0, a1));
}

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  const __m256 r = _mm256_set1_ps(1.f / std::sqrt(hsum(acc) / static_cast<float>(n) + eps));
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), r)));
}

// out[i] = silu(gate[i]) * up[i] = gate / (1 + e^-gate) * up
void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp(_mm256_sub_ps(zero, g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
}

// out[i] = gelu_tanh(gate[i]) * up[i], by 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)), u = sqrt(2 / pi) (g + 0.044715 g^3).
void gelu_tanh_mul(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
  const __m256 beta2 = _mm256_set1_ps(2.f * 0.7978845608028654f), kappa = _mm256_set1_ps(0.044715f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 u2 = _mm256_mul_ps(beta2, _mm256_fmadd_ps(kappa, _mm256_mul_ps(g, _mm256_mul_ps(g, g)), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp(_mm256_sub_ps(zero, u2))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
}

// One query head's attention in attend_batch: its query, the entries it sees, and its scratch.
struct Query {
  const float* q;  // d floats
  const int32_t* rows;
  int64_t count;
  float* scores;  // count floats (+ 8 of slack)
  float* acc;     // d floats: the weighted values' sums so far
  float* out;     // d floats
  float top, inv;
};

// acc[8c + j] += scores[k] * values[rows[k] * d + 8c + j] for k in [k0, k1), in order, for c < C.
template <int C>
inline void add_lanes(const float* scores, const float* values, const int32_t* rows, int64_t k0, int64_t k1, int64_t d,
                      float* acc) {
  __m256 a[C];
  for (int c = 0; c < C; ++c) a[c] = _mm256_loadu_ps(acc + 8 * c);
  for (int64_t k = k0; k < k1; ++k) {
    const __m256 s = _mm256_set1_ps(scores[k]);
    const float* v = values + rows[k] * d;
    for (int c = 0; c < C; ++c) a[c] = _mm256_fmadd_ps(s, _mm256_loadu_ps(v + 8 * c), a[c]);
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
}

// add_lanes over the lanes [from, d) (from a multiple of 8): up to 64 lanes a pass over the entries, eight
// chains of fmas side by side, so that the sums' latency overlaps.
void add_values(const float* scores, const float* values, const int32_t* rows, int64_t k0, int64_t k1, int64_t d,
                float* acc, int64_t from) {
  int64_t i = from;
  for (; i + 64 <= d; i += 64) add_lanes<8>(scores, values + i, rows, k0, k1, d, acc + i);
  switch ((d - i) / 8) {
    case 7: add_lanes<7>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 6: add_lanes<6>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 5: add_lanes<5>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 4: add_lanes<4>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 3: add_lanes<3>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 2: add_lanes<2>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 1: add_lanes<1>(scores, values + i, rows, k0, k1, d, acc + i); break;
    default: break;
  }
}

// Entries per chunk in attend_batch: 32 keys or values of 128 floats are 16 KB, which stay in L1.
constexpr int64_t kChunk = 32;

// Attention of several query heads over the entries they see of one kv head's keys and values (the heads
// of one kv head, in one or more rows): per query, scores q . k * scale [soft-capped], their softmax, and
// the values weighted by it. A chunk of entries at a time for all the queries, so that each chunk is read
// from memory once and then from L1 (one query at a time read every entry once per query head). Each
// query's sums run in entry order whatever the batch and the chunks (the value sums are parked in acc
// between chunks), so a query's result has the same bits alone or batched.
// wide: the 512-bit sums of simd512 (same bits), on a CPU with AVX-512.
void attend_batch(Query* qs, int nq, const float* keys, const float* values, int64_t d, float scale, float cap,
                  bool wide) {
  int64_t most = 0;
  for (int b = 0; b < nq; ++b) {
    qs[b].top = -INFINITY;
    most = std::max(most, qs[b].count);
  }
  for (int64_t c0 = 0; c0 < most; c0 += kChunk)
    for (int b = 0; b < nq; ++b) {
      Query& u = qs[b];
      const int64_t end = std::min(c0 + kChunk, u.count);
      if (wide) simd512::scores(u.q, keys, u.rows, c0, end, d, scale, u.scores);
      for (int64_t j = c0; j < end; ++j) {
        if (!wide) u.scores[j] = dot(u.q, keys + u.rows[j] * d, d) * scale;
        if (cap > 0.f) u.scores[j] = std::tanh(u.scores[j] / cap) * cap;
        u.top = std::max(u.top, u.scores[j]);
      }
    }
  for (int b = 0; b < nq; ++b) {  // e^(score - top) through exp(); the last few padded with top
    Query& u = qs[b];
    const __m256 m = _mm256_set1_ps(u.top);
    __m256 total = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= u.count; j += 8) {
      const __m256 p = exp(_mm256_sub_ps(_mm256_loadu_ps(u.scores + j), m));
      _mm256_storeu_ps(u.scores + j, p);
      total = _mm256_add_ps(total, p);
    }
    float tail = 0.f;
    if (j < u.count) {
      alignas(32) float buf[8];
      for (int k = 0; k < 8; ++k) buf[k] = j + k < u.count ? u.scores[j + k] : u.top;
      _mm256_store_ps(buf, exp(_mm256_sub_ps(_mm256_load_ps(buf), m)));
      for (int64_t k = 0; j + k < u.count; ++k) {
        u.scores[j + k] = buf[k];
        tail += buf[k];
      }
    }
    u.inv = 1.f / (hsum(total) + tail);
    std::fill(u.acc, u.acc + d, 0.f);
  }
  for (int64_t c0 = 0; c0 < most; c0 += kChunk)
    for (int b = 0; b < nq; ++b) {
      Query& u = qs[b];
      const int64_t c1 = std::min(c0 + kChunk, u.count);
      if (c1 <= c0) continue;
      // The 512-bit sums take the lanes [0, d - d % 16), the 256-bit ones the rest.
      if (wide) simd512::add_values(u.scores, values, u.rows, c0, c1, d, u.acc);
      add_values(u.scores, values, u.rows, c0, c1, d, u.acc, wide ? d - d % 16 : 0);
    }
  for (int b = 0; b < nq; ++b)
    for (int64_t i = 0; i < d; i += 8)
      _mm256_storeu_ps(qs[b].out + i, _mm256_mul_ps(_mm256_loadu_ps(qs[b].acc + i), _mm256_set1_ps(qs[b].inv)));
}

}  // namespace simd
#pragma GCC pop_options

// The same sums in 512-bit registers, for the AVX-512 paths: two keys' dot products or 16 lanes of value
// sums per instruction, each lane doing simd's operations in simd's order, so the same bits.
namespace simd512 {
// Outside the AVX-512 target region: it runs on every CPU.
bool usable() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return ok;
}
}  // namespace simd512

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
namespace simd512 {

// Query lanes 8c..8c+7 in both 256-bit halves, and keys y and z side by side.
inline __m512 both(const float* x) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(x)); }
inline __m512 pair(const float* y, const float* z) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(y)), _mm256_loadu_ps(z), 1);
}

// out[j] = simd::dot(q, keys + rows[j] * d, d) * scale for j in [j0, j1), two keys a register (lanes 0-7 the
// first key's, 8-15 the second's), and each half reduced as simd::hsum reduces its register.
void scores(const float* q, const float* keys, const int32_t* rows, int64_t j0, int64_t j1, int64_t d, float scale,
            float* out) {
  for (int64_t j = j0; j < j1; j += 2) {
    const float* y = keys + rows[j] * d;
    const float* z = j + 1 < j1 ? keys + rows[j + 1] * d : y;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
      a0 = _mm512_fmadd_ps(both(q + i), pair(y + i, z + i), a0);
      a1 = _mm512_fmadd_ps(both(q + i + 8), pair(y + i + 8, z + i + 8), a1);
    }
    if (i < d) a0 = _mm512_fmadd_ps(both(q + i), pair(y + i, z + i), a0);
    __m512 v = _mm512_add_ps(a0, a1);
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));                   // low + high 128 bits
    v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(3, 2, 3, 2)));      // + movehl
    v = _mm512_add_ps(v, _mm512_movehdup_ps(v));                             // + movehdup, lane 0
    out[j] = _mm512_cvtss_f32(v) * scale;
    if (j + 1 < j1) out[j + 1] = _mm512_cvtss_f32(_mm512_castps128_ps512(_mm512_extractf32x4_ps(v, 2))) * scale;
  }
}

// simd::add_lanes over 16 lanes a register: acc[16c + l] += scores[k] * values[rows[k] * d + 16c + l].
template <int C>
inline void add_lanes(const float* scores, const float* values, const int32_t* rows, int64_t k0, int64_t k1, int64_t d,
                      float* acc) {
  __m512 a[C];
  for (int c = 0; c < C; ++c) a[c] = _mm512_loadu_ps(acc + 16 * c);
  for (int64_t k = k0; k < k1; ++k) {
    const __m512 s = _mm512_set1_ps(scores[k]);
    const float* v = values + rows[k] * d;
    for (int c = 0; c < C; ++c) a[c] = _mm512_fmadd_ps(s, _mm512_loadu_ps(v + 16 * c), a[c]);
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + 16 * c, a[c]);
}

// add_lanes over the lanes [0, d - d % 16); simd::add_values takes the last 8 when d % 16 == 8.
void add_values(const float* scores, const float* values, const int32_t* rows, int64_t k0, int64_t k1, int64_t d,
                float* acc) {
  int64_t i = 0;
  for (; i + 128 <= d; i += 128) add_lanes<8>(scores, values + i, rows, k0, k1, d, acc + i);
  switch ((d - i) / 16) {
    case 7: add_lanes<7>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 6: add_lanes<6>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 5: add_lanes<5>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 4: add_lanes<4>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 3: add_lanes<3>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 2: add_lanes<2>(scores, values + i, rows, k0, k1, d, acc + i); break;
    case 1: add_lanes<1>(scores, values + i, rows, k0, k1, d, acc + i); break;
    default: break;
  }
}

}  // namespace simd512
#pragma GCC pop_options

namespace scalar {

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

}  // namespace scalar

// ---------------------------------------------------------------------------------------------

Proj make_proj(const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& parts) {
  TORCH_CHECK(!parts.empty(), "a projection needs at least one weight");
  Proj p;
  for (const auto& [weight, type, out, in, bias] : parts) {
    TORCH_CHECK(block_bytes(type) > 0, "ggml type ", type, " is not supported");
    TORCH_CHECK(p.in == 0 || p.in == in, "the weights of one projection must read one input size");
    TORCH_CHECK(in % block_values(type) == 0, "in_features must be a multiple of the block size");
    const int64_t nb = in / block_values(type), row_bytes = nb * block_bytes(type);
    TORCH_CHECK(weight.scalar_type() == torch::kByte && weight.is_contiguous() && weight.numel() == out * row_bytes,
                "weight bytes do not match a [", out, ", ", in, "] tensor");
    Part part{weight, torch::Tensor(), type, out, row_bytes, nb};
    if (bias.has_value()) {
      TORCH_CHECK(bias->numel() == out, "a bias must have one value per output");
      part.bias = bias->to(torch::kFloat).contiguous();
    }
    p.in = in;
    p.out += out;
    p.bytes += out * row_bytes;
    p.kinds[kind_of(type)] = true;
    p.parts.push_back(std::move(part));
  }
  return p;
}

class Pass {
 public:
  // activation: Activation; attention_scale: multiplies q . k (0: 1 / sqrt(head_dim)); softcap: > 0 caps the
  // scores at cap * tanh(score / cap).
  Pass(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate, double eps,
       int64_t activation, double attention_scale, double softcap)
      : hidden_(hidden), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), intermediate_(intermediate),
        eps_(static_cast<float>(eps)), activation_(activation), attention_scale_(static_cast<float>(attention_scale)),
        softcap_(static_cast<float>(softcap)) {
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads must be a multiple of kv_heads");
    TORCH_CHECK(head_dim % 2 == 0, "head_dim must be even");
    TORCH_CHECK(activation == kSilu || activation == kGeluTanh, "activation must be 0 (SiLU) or 1 (GELU-tanh)");
    TORCH_CHECK(attention_scale >= 0 && softcap >= 0, "attention_scale and softcap must not be negative");
  }

  void add_layer(torch::Tensor input_norm, const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& qkv,
                 const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& o,
                 torch::Tensor post_norm,
                 const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& gate_up,
                 const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& down,
                 const c10::optional<torch::Tensor>& q_norm, const c10::optional<torch::Tensor>& k_norm,
                 const c10::optional<torch::Tensor>& attn_out_norm, const c10::optional<torch::Tensor>& mlp_out_norm,
                 int64_t window, int64_t rope) {
    Layer l{input_norm.to(torch::kFloat).contiguous(), post_norm.to(torch::kFloat).contiguous(), make_proj(qkv),
            make_proj(o), make_proj(gate_up), make_proj(down)};
    auto norm = [](const c10::optional<torch::Tensor>& w, int64_t size, const char* what) {
      if (!w.has_value()) return torch::Tensor();
      TORCH_CHECK(w->numel() == size, what, " must have ", size, " values");
      return w->to(torch::kFloat).contiguous();
    };
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q and k norms come together");
    l.q_norm = norm(q_norm, head_dim_, "q_norm");
    l.k_norm = norm(k_norm, head_dim_, "k_norm");
    l.attn_out_norm = norm(attn_out_norm, hidden_, "attn_out_norm");
    l.mlp_out_norm = norm(mlp_out_norm, hidden_, "mlp_out_norm");
    TORCH_CHECK(window >= 0 && rope >= 0, "window and rope must not be negative");
    l.window = window;
    l.rope = rope;
    const int64_t q = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
    TORCH_CHECK(l.input_norm.numel() == hidden_ && l.post_norm.numel() == hidden_, "norm weights must have ", hidden_,
                " values");
    TORCH_CHECK(l.qkv.in == hidden_ && l.qkv.out == q + 2 * kv, "q/k/v must map ", hidden_, " to ", q + 2 * kv);
    TORCH_CHECK(l.o.in == q && l.o.out == hidden_, "o_proj must map ", q, " to ", hidden_);
    TORCH_CHECK(l.gate_up.in == hidden_ && l.gate_up.out == 2 * intermediate_, "gate/up must map ", hidden_, " to ",
                2 * intermediate_);
    TORCH_CHECK(l.down.in == intermediate_ && l.down.out == hidden_, "down_proj must map ", intermediate_, " to ",
                hidden_);
    layers_.push_back(std::move(l));
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // hidden [n, hidden] float32, updated in place. keys/values [layers, kv_heads, capacity, head_dim] float32:
  // the pass writes its rows' entries at slots start..start+n-1. cos/sin [n, head_dim]: each row's rotary
  // factors. visible [n, start + n] bool, or none: row i sees slots 0..start+i. capture: the layers whose
  // outputs go to captured [n, len(capture), hidden]. first, last: the layers [first, last) to run (last -1:
  // through the last layer); hidden is then the output of layer first - 1 and becomes that of layer last - 1,
  // and only those layers' entries are written. Each layer's arithmetic is the same whatever the range, so a
  // range [0, E) then [E, L) gives bitwise what [0, L) gives.
  void run(torch::Tensor hidden, torch::Tensor keys, torch::Tensor values, int64_t start, torch::Tensor cos,
           torch::Tensor sin, const c10::optional<torch::Tensor>& visible, const std::vector<int64_t>& capture,
           const c10::optional<torch::Tensor>& captured, const std::string& path_name, int64_t first, int64_t last) {
    const int64_t n = hidden.size(0), end = start + n;
    check_cache(keys, end);
    check_cache(values, end);
    // The cache slots each row attends to, in cache order.
    std::vector<std::vector<int32_t>> seen(n);
    if (visible.has_value()) {
      const auto vis = visible->to(torch::kBool).contiguous();
      TORCH_CHECK(vis.dim() == 2 && vis.size(0) == n && vis.size(1) >= end, "visible must be [n, start + n]");
      const bool* vp = vis.data_ptr<bool>();
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < end; ++j)
          if (vp[i * vis.size(1) + j]) seen[i].push_back(static_cast<int32_t>(j));
    } else {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j <= start + i; ++j) seen[i].push_back(static_cast<int32_t>(j));
    }
    std::vector<RowCache> where_to(n);
    for (int64_t i = 0; i < n; ++i)
      where_to[i] = {keys.data_ptr<float>(), values.data_ptr<float>(), keys.size(2), start + i};
    execute(hidden, where_to, seen, cos, sin, capture, captured, path_name, first, last);
  }

  // The rows of several sequences in one pass (continuous batching). caches: each sequence's (keys, values),
  // laid out as in run(). Row i belongs to sequence owner[i], writes its entries at slot slots[i] of that
  // sequence's cache and attends to the slots seen_index[seen_offsets[i]:seen_offsets[i + 1]] (ascending) of
  // it. A row computes exactly what run() computes for it in a pass of its own sequence alone.
  void run_ragged(torch::Tensor hidden, const std::vector<std::pair<torch::Tensor, torch::Tensor>>& caches,
                  torch::Tensor owner, torch::Tensor slots, torch::Tensor seen_offsets, torch::Tensor seen_index,
                  torch::Tensor cos, torch::Tensor sin, const std::vector<int64_t>& capture,
                  const c10::optional<torch::Tensor>& captured, const std::string& path_name) {
    const int64_t n = hidden.size(0);
    for (const auto* t : {&owner, &slots, &seen_offsets})
      TORCH_CHECK(t->scalar_type() == torch::kLong && t->dim() == 1 && t->is_contiguous(),
                  "owner, slots and seen_offsets must be contiguous int64 vectors");
    TORCH_CHECK(seen_index.scalar_type() == torch::kInt && seen_index.dim() == 1 && seen_index.is_contiguous(),
                "seen_index must be a contiguous int32 vector");
    TORCH_CHECK(owner.size(0) == n && slots.size(0) == n && seen_offsets.size(0) == n + 1,
                "owner and slots need one entry per row, seen_offsets n + 1");
    const int64_t *op = owner.data_ptr<int64_t>(), *sp = slots.data_ptr<int64_t>(), *fp = seen_offsets.data_ptr<int64_t>();
    const int32_t* ip = seen_index.data_ptr<int32_t>();
    TORCH_CHECK(fp[0] == 0 && fp[n] == seen_index.size(0), "seen_offsets must run from 0 to len(seen_index)");
    std::vector<RowCache> where_to(n);
    std::vector<std::vector<int32_t>> seen(n);
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(op[i] >= 0 && op[i] < static_cast<int64_t>(caches.size()), "row ", i, " names no cache");
      const auto& [keys, values] = caches[op[i]];
      const int64_t capacity = keys.size(2);
      TORCH_CHECK(sp[i] >= 0 && sp[i] < capacity, "row ", i, " writes outside its cache");
      check_cache(keys, sp[i] + 1);
      check_cache(values, sp[i] + 1);
      TORCH_CHECK(fp[i + 1] >= fp[i], "seen_offsets must not decrease");
      for (int64_t j = fp[i]; j < fp[i + 1]; ++j) {
        TORCH_CHECK(ip[j] >= 0 && ip[j] < capacity && (j == fp[i] || ip[j] > ip[j - 1]),
                    "row ", i, " must see ascending slots inside its cache");
        seen[i].push_back(ip[j]);
      }
      where_to[i] = {keys.data_ptr<float>(), values.data_ptr<float>(), capacity, sp[i]};
    }
    execute(hidden, where_to, seen, cos, sin, capture, captured, path_name, 0, -1);
  }

 private:
  // Where one row's keys and values live: its sequence's cache, that cache's capacity, and the row's slot.
  struct RowCache {
    float* keys;
    float* values;
    int64_t capacity, slot;
  };

  void check_cache(const torch::Tensor& t, int64_t end) const {
    TORCH_CHECK(t.scalar_type() == torch::kFloat && t.is_contiguous() && t.dim() == 4 && t.size(0) == num_layers() &&
                    t.size(1) == kv_heads_ && t.size(3) == head_dim_ && t.size(2) >= end,
                "the cache must be contiguous float32 [", num_layers(), ", ", kv_heads_, ", >= ", end, ", ",
                head_dim_, "]");
  }

  void execute(torch::Tensor hidden, const std::vector<RowCache>& where_to,
               const std::vector<std::vector<int32_t>>& seen, torch::Tensor cos, torch::Tensor sin,
               const std::vector<int64_t>& capture, const c10::optional<torch::Tensor>& captured,
               const std::string& path_name, int64_t first, int64_t last) {
    const int64_t path = specwise_gguf::parse_path(path_name);
    const int64_t n = hidden.size(0), H = hidden_, d = head_dim_;
    const int64_t L = num_layers();
    if (last < 0) last = L;
    TORCH_CHECK(0 <= first && first <= last && last <= L, "layers [", first, ", ", last, ") are not within [0, ", L,
                ")");
    TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == H && hidden.scalar_type() == torch::kFloat &&
                    hidden.is_contiguous(), "hidden must be contiguous float32 [n, ", H, "]");
    // One rotary table [n, head_dim], or several [tables, n, head_dim] that layers pick from (Layer::rope).
    TORCH_CHECK(cos.sizes() == sin.sizes() && (cos.dim() == 2 || cos.dim() == 3) && cos.size(-2) == n &&
                    cos.size(-1) == d, "cos and sin must be [n, head_dim] or [tables, n, head_dim]");
    const int64_t tables = cos.dim() == 3 ? cos.size(0) : 1;
    for (const Layer& layer : layers_)
      TORCH_CHECK(layer.rope < tables, "a layer reads rotary table ", layer.rope, " of ", tables);
    if (n == 0) return;
    const auto cs = cos.to(torch::kFloat).contiguous(), sn = sin.to(torch::kFloat).contiguous();
    const float *cosp = cs.data_ptr<float>(), *sinp = sn.data_ptr<float>();
    size_t widest_seen = 0;
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(!seen[i].empty(), "row ", i, " attends to nothing");
      widest_seen = std::max(widest_seen, seen[i].size());
    }
    std::vector<int64_t> where(L, -1);
    for (size_t c = 0; c < capture.size(); ++c) {
      TORCH_CHECK(capture[c] >= first && capture[c] < last, "capture layer ", capture[c], " is not run");
      where[capture[c]] = static_cast<int64_t>(c);
    }
    float* cap = nullptr;
    if (!capture.empty()) {
      TORCH_CHECK(captured.has_value() && captured->is_contiguous() && captured->scalar_type() == torch::kFloat &&
                      captured->numel() == n * static_cast<int64_t>(capture.size()) * H,
                  "captured must be contiguous float32 [n, len(capture), hidden]");
      cap = captured->data_ptr<float>();
    }

    const int64_t q_size = heads_ * d, kv_size = kv_heads_ * d, qkv_size = q_size + 2 * kv_size;
    const int64_t I = intermediate_, widest = std::max(H, std::max(I, q_size));
    // One scratch buffer per activation layout, wide enough for any projection's input. Every layout's rows
    // are whole multiples of 64 bytes, so each buffer starts 64-byte aligned.
    int64_t stride[kKinds], most = 0;
    for (int k = 0; k < kKinds; ++k) {
      stride[k] = activation_stride(kind_type(k), (widest + 255) / 256 * 256);
      most = std::max(most, stride[k]);
    }
    std::vector<float> x(n * H), qkv(n * qkv_size), attn(n * q_size), proj(n * H), gu(n * 2 * I), mid(n * I);
    std::vector<uint8_t> act_buffer(kKinds * n * most + 64);
    uint8_t* act[kKinds];
    uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(act_buffer.data()) + 63) & ~uintptr_t(63));
    for (int k = 0; k < kKinds; ++k) act[k] = base + k * n * most;
    float* hp = hidden.data_ptr<float>();
    const float scale = attention_scale_ > 0.f ? attention_scale_ : 1.f / std::sqrt(static_cast<float>(d));
    const bool vec = path != 0 && d % 8 == 0 && H % 8 == 0 && I % 8 == 0;
    const bool wide = vec && path >= 2 && simd512::usable();  // the AVX-512 paths (gguf_kernel.h)
    const int64_t group = heads_ / kv_heads_;
    const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), 64)));

    // Quantize rows r (this thread's: r = t, t + nt, ...) of x [n, in] for every layout the projection reads.
    auto quantize = [&](const Proj& p, const float* src, int t, int nt) {
      for (int64_t r = t; r < n; r += nt)
        for (int k = 0; k < kKinds; ++k)
          if (p.kinds[k]) specwise_gguf::quantize_rows_serial(path, kind_type(k), src, r, r + 1, p.in, act[k], stride[k]);
    };
    // This thread's share of the projection's outputs, split by weight bytes in runs of 16 rows.
    auto project = [&](const Proj& p, float* y, int t, int nt) {
      const int64_t lo_bytes = p.bytes * t / nt, hi_bytes = p.bytes * (t + 1) / nt;
      int64_t offset = 0, before = 0;
      for (const Part& part : p.parts) {
        auto first = [&](int64_t target) {  // the part's first row at or after `target` bytes, rounded to 16
          if (target <= before) return int64_t{0};
          const int64_t row = (target - before + part.row_bytes - 1) / part.row_bytes;
          return std::min(part.out, (row + 15) / 16 * 16);
        };
        const int64_t o0 = first(lo_bytes), o1 = t == nt - 1 ? part.out : first(hi_bytes);
        const uint8_t* wp = part.weight.data_ptr<uint8_t>();
        const int k = kind_of(part.type);
        if (o1 > o0) {
          specwise_gguf::dot_rows(path, part.type, wp, part.row_bytes, o0, o1, part.nb, act[k], stride[k], n,
                                  y + offset, p.out);
          if (part.bias.defined()) {
            const float* b = part.bias.data_ptr<float>();
            for (int64_t r = 0; r < n; ++r)
              for (int64_t o = o0; o < o1; ++o) y[r * p.out + offset + o] += b[o];
          }
        }
        offset += part.out;
        before += part.out * part.row_bytes;
      }
    };

#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      // Scratch for up to kBatch query heads at once (attend_batch): their scores and value sums.
      std::vector<float> scores(kBatch * (widest_seen + 8)), sums(kBatch * d), rotated(d);
      for (int64_t l = first; l < last; ++l) {
        const Layer& layer = layers_[l];
        for (int64_t r = t; r < n; r += nt) {
          if (vec) simd::rms_norm(hp + r * H, layer.input_norm.data_ptr<float>(), H, eps_, x.data() + r * H);
          else scalar::rms_norm(hp + r * H, layer.input_norm.data_ptr<float>(), H, eps_, x.data() + r * H);
        }
        quantize(layer.qkv, x.data(), t, nt);
#pragma omp barrier
        project(layer.qkv, qkv.data(), t, nt);
#pragma omp barrier
        // Rotary embedding of q (in place) and k (into the cache); v into the cache. Units: (row, head).
        for (int64_t u = t; u < n * (heads_ + 2 * kv_heads_); u += nt) {
          const int64_t r = u / (heads_ + 2 * kv_heads_), h = u % (heads_ + 2 * kv_heads_);
          float* src = qkv.data() + r * qkv_size + h * d;
          const RowCache& c = where_to[r];
          if (h >= heads_ + kv_heads_) {
            std::memcpy(c.values + ((l * kv_heads_ + (h - heads_ - kv_heads_)) * c.capacity + c.slot) * d, src, d * 4);
            continue;
          }
          if (layer.q_norm.defined()) {  // RMSNorm of the head, in place, before the rotary embedding
            const float* w = (h < heads_ ? layer.q_norm : layer.k_norm).data_ptr<float>();
            if (vec) simd::rms_norm(src, w, d, eps_, src);
            else scalar::rms_norm(src, w, d, eps_, src);
          }
          const float *co = cosp + (layer.rope * n + r) * d, *si = sinp + (layer.rope * n + r) * d;
          const int64_t half = d / 2;
          for (int64_t i = 0; i < half; ++i) rotated[i] = src[i] * co[i] - src[i + half] * si[i];
          for (int64_t i = half; i < d; ++i) rotated[i] = src[i] * co[i] + src[i - half] * si[i];
          float* dst = h < heads_ ? src : c.keys + ((l * kv_heads_ + (h - heads_)) * c.capacity + c.slot) * d;
          std::memcpy(dst, rotated.data(), d * 4);
        }
#pragma omp barrier
        // Each thread a run of (row, head) units taken kv head by kv head (all rows' heads of kv head 0, then
        // of kv head 1, ...), so that a thread reads the cache entries of as few kv heads as it can and each
        // kv head's entries are read by as few threads. On the SIMD path a thread's units of one kv head and
        // one cache go in batches through attend_batch, which reads each entry once for all of them.
        const int64_t u_lo = n * heads_ * t / nt, u_hi = n * heads_ * (t + 1) / nt;
        simd::Query batch[kBatch];
        int nq = 0;
        const RowCache* owner = nullptr;
        int64_t kv = 0;
        auto flush = [&]() {
          if (nq == 0) return;
          simd::attend_batch(batch, nq, owner->keys + (l * kv_heads_ + kv) * owner->capacity * d,
                             owner->values + (l * kv_heads_ + kv) * owner->capacity * d, d, scale, softcap_, wide);
          nq = 0;
        };
        for (int64_t v = u_lo; v < u_hi; ++v) {  // v = (g * n + r) * group + (h - g * group)
          const int64_t g = v / (n * group), r = v / group % n, h = g * group + v % group;
          const RowCache* c = &where_to[r];
          // A row's visible entries hold one position each, up to its own, in cache order: a sliding window
          // keeps the last `window` of them.
          const auto& all = seen[r];
          const int64_t visible = static_cast<int64_t>(all.size());
          const int64_t count = layer.window > 0 ? std::min(visible, layer.window) : visible;
          const int32_t* rows = all.data() + (visible - count);
          const float* query = qkv.data() + r * qkv_size + h * d;
          float* out = attn.data() + r * q_size + h * d;
          if (!vec) {
            scalar::attend(query, c->keys + (l * kv_heads_ + g) * c->capacity * d,
                           c->values + (l * kv_heads_ + g) * c->capacity * d, rows, count, d, scale, softcap_,
                           scores.data(), out);
            continue;
          }
          if (nq == kBatch || (nq > 0 && (g != kv || c->keys != owner->keys || c->capacity != owner->capacity)))
            flush();
          owner = c;
          kv = g;
          batch[nq] = {query, rows, count, scores.data() + nq * (widest_seen + 8), sums.data() + nq * d, out, 0.f, 0.f};
          ++nq;
        }
        flush();
#pragma omp barrier
        quantize(layer.o, attn.data(), t, nt);
#pragma omp barrier
        project(layer.o, proj.data(), t, nt);
#pragma omp barrier
        for (int64_t r = t; r < n; r += nt) {
          float* h = hp + r * H;
          const float* add = proj.data() + r * H;
          if (layer.attn_out_norm.defined()) {  // attention's output normalized before the residual (Gemma)
            if (vec) simd::rms_norm(add, layer.attn_out_norm.data_ptr<float>(), H, eps_, x.data() + r * H);
            else scalar::rms_norm(add, layer.attn_out_norm.data_ptr<float>(), H, eps_, x.data() + r * H);
            add = x.data() + r * H;
          }
          for (int64_t i = 0; i < H; ++i) h[i] += add[i];
          if (vec) simd::rms_norm(h, layer.post_norm.data_ptr<float>(), H, eps_, x.data() + r * H);
          else scalar::rms_norm(h, layer.post_norm.data_ptr<float>(), H, eps_, x.data() + r * H);
        }
        quantize(layer.gate_up, x.data(), t, nt);
#pragma omp barrier
        project(layer.gate_up, gu.data(), t, nt);
#pragma omp barrier
        for (int64_t r = t; r < n; r += nt) {
          const float* g = gu.data() + r * 2 * I;
          if (activation_ == kGeluTanh) {
            if (vec) simd::gelu_tanh_mul(g, g + I, I, mid.data() + r * I);
            else scalar::gelu_tanh_mul(g, g + I, I, mid.data() + r * I);
          } else if (vec) {
            simd::silu_mul(g, g + I, I, mid.data() + r * I);
          } else {
            scalar::silu_mul(g, g + I, I, mid.data() + r * I);
          }
        }
        quantize(layer.down, mid.data(), t, nt);
#pragma omp barrier
        project(layer.down, proj.data(), t, nt);
#pragma omp barrier
        // The same thread handles row r in every row-wise step, so the next layer's norm needs no barrier.
        for (int64_t r = t; r < n; r += nt) {
          float* h = hp + r * H;
          const float* add = proj.data() + r * H;
          if (layer.mlp_out_norm.defined()) {  // the MLP's output normalized before the residual (Gemma)
            if (vec) simd::rms_norm(add, layer.mlp_out_norm.data_ptr<float>(), H, eps_, x.data() + r * H);
            else scalar::rms_norm(add, layer.mlp_out_norm.data_ptr<float>(), H, eps_, x.data() + r * H);
            add = x.data() + r * H;
          }
          for (int64_t i = 0; i < H; ++i) h[i] += add[i];
          if (where[l] >= 0)
            std::memcpy(cap + (r * static_cast<int64_t>(capture.size()) + where[l]) * H, h, H * 4);
        }
      }
    }
  }

  int64_t hidden_, heads_, kv_heads_, head_dim_, intermediate_;
  float eps_;
  int64_t activation_;
  float attention_scale_, softcap_;
  std::vector<Layer> layers_;
};

}  // namespace

namespace specwise_gguf {

// The pass's attention alone, for the tests: queries [nq, d] over the entries rows[i] (ascending slots) of
// keys and values [slots, d], as one attend_batch call, its 512-bit sums (wide) or its 256-bit ones.
torch::Tensor attend(torch::Tensor queries, torch::Tensor keys, torch::Tensor values,
                     const std::vector<std::vector<int32_t>>& rows, double scale, double softcap, bool wide) {
  TORCH_CHECK(queries.dim() == 2 && keys.dim() == 2 && keys.sizes() == values.sizes() &&
                  queries.size(1) == keys.size(1), "queries [nq, d], keys and values [slots, d]");
  const int64_t nq = queries.size(0), d = queries.size(1);
  TORCH_CHECK(nq <= kBatch && static_cast<int64_t>(rows.size()) == nq && d % 8 == 0, "at most ", kBatch,
              " queries, one entry list each, d a multiple of 8");
  TORCH_CHECK(!wide || simd512::usable(), "this CPU has no AVX-512");
  auto q = queries.to(torch::kFloat).contiguous(), k = keys.to(torch::kFloat).contiguous();
  auto v = values.to(torch::kFloat).contiguous();
  auto out = torch::zeros({nq, d}, torch::kFloat);
  size_t widest = 0;
  for (const auto& r : rows) {
    TORCH_CHECK(!r.empty(), "each query sees at least one entry");
    for (int32_t slot : r) TORCH_CHECK(slot >= 0 && slot < keys.size(0), "slot ", slot, " is outside the keys");
    widest = std::max(widest, r.size());
  }
  std::vector<float> scores(nq * (widest + 8)), sums(nq * d);
  simd::Query batch[kBatch];
  for (int64_t b = 0; b < nq; ++b)
    batch[b] = {q.data_ptr<float>() + b * d, rows[b].data(), static_cast<int64_t>(rows[b].size()),
                scores.data() + b * (widest + 8), sums.data() + b * d, out.data_ptr<float>() + b * d, 0.f, 0.f};
  simd::attend_batch(batch, static_cast<int>(nq), k.data_ptr<float>(), v.data_ptr<float>(), d,
                     static_cast<float>(scale), static_cast<float>(softcap), wide);
  return out;
}

void bind_pass(pybind11::module& m) {
  m.def("attend", &attend, "the decoder pass's attention of up to 16 queries (for the tests)",
        pybind11::arg("queries"), pybind11::arg("keys"), pybind11::arg("values"), pybind11::arg("rows"),
        pybind11::arg("scale"), pybind11::arg("softcap") = 0.0, pybind11::arg("wide") = false);
  pybind11::class_<Pass>(m, "DecoderPass", "every decoder layer of a GGUF decoder model as one call")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, int64_t, double, double>(),
           pybind11::arg("hidden"), pybind11::arg("heads"), pybind11::arg("kv_heads"), pybind11::arg("head_dim"),
           pybind11::arg("intermediate"), pybind11::arg("eps"), pybind11::arg("activation") = 0,
           pybind11::arg("attention_scale") = 0.0, pybind11::arg("softcap") = 0.0)
      .def("add_layer", &Pass::add_layer, pybind11::arg("input_norm"), pybind11::arg("qkv"), pybind11::arg("o"),
           pybind11::arg("post_norm"), pybind11::arg("gate_up"), pybind11::arg("down"),
           pybind11::arg("q_norm") = pybind11::none(), pybind11::arg("k_norm") = pybind11::none(),
           pybind11::arg("attn_out_norm") = pybind11::none(), pybind11::arg("mlp_out_norm") = pybind11::none(),
           pybind11::arg("window") = 0, pybind11::arg("rope") = 0)
      .def("num_layers", &Pass::num_layers)
      .def("run", &Pass::run, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("run_ragged", &Pass::run_ragged, pybind11::call_guard<pybind11::gil_scoped_release>());
}

}  // namespace specwise_gguf
