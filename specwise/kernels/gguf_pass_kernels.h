// The decoder pass's element-wise and attention kernels (gguf_pass.cpp runs them), one instruction set a
// file: gguf_pass_scalar.cpp (the portable reference), gguf_pass_avx2.cpp, gguf_pass_avx512.cpp (attention's
// sums in 512-bit registers, compiled under its own target pragma so that no AVX-512 instruction reaches a
// CPU without it). The pass picks one table (pass_kernels) per run and calls through it once per row or per
// batch of query heads, never per value. No PyTorch here: the kernel files compile without it.
#pragma once

#include <cstdint>

namespace specwise_pass {

// One query head's attention in a Kernels::attend batch: its query, the entries it sees, and its scratch.
struct Query {
  const float* q;  // d floats
  const int32_t* rows;
  int64_t count;
  float* scores;  // count floats (+ 8 of slack)
  float* acc;     // d floats: the weighted values' sums so far
  float* out;     // d floats
  float top, inv;
};

constexpr int kBatch = 16;  // query heads per Kernels::attend call at most

// e^x for the activations, about 1 ulp: Cephes' polynomial after a reduction by ln 2 (split in a high and a
// low part), inputs clamped to [-kClamp, kClamp]. avx2's exp and avx512's exp16 read these constants and do
// the same operations lane by lane, so that both tables give the same bits.
namespace exp_poly {
constexpr float kClamp = 88.3762626647949f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};  // highest power first
}  // namespace exp_poly

struct Kernels {
  // y[i] = w[i] * x[i] / sqrt(mean(x^2) + eps), i < n (y may be x).
  void (*rms_norm)(const float* x, const float* w, int64_t n, float eps, float* y);
  // out[i] = silu(gate[i]) * up[i], i < n.
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out);
  // out[i] = gelu_tanh(gate[i]) * up[i], i < n.
  void (*gelu_tanh_mul)(const float* gate, const float* up, int64_t n, float* out);
  // Each query of qs[0, nq) over its entries of one kv head's keys and values [slots, d]: scores q . k * scale
  // [soft-capped at cap * tanh(score / cap) when cap > 0], their softmax, the values weighted by it into
  // out. Each query's sums run in entry order whatever the batch, so its result has the same bits alone.
  void (*attend)(Query* qs, int nq, const float* keys, const float* values, int64_t d, float scale, float cap);
};

// The tables. The SIMD ones need n and d multiples of 8; avx512's is avx2's with the activations and
// attention's sums in 512-bit registers (lane by lane the same operations, so the same bits).
namespace scalar {
extern const Kernels kernels;
}  // namespace scalar
namespace avx2 {
extern const Kernels kernels;
}  // namespace avx2
namespace avx512 {
extern const Kernels kernels;
// Whether this CPU runs avx512's table (AVX-512 F and DQ); outside the AVX-512 target region.
bool usable();
}  // namespace avx512

// What one file calls in another, once per chunk of entries (the AVX2 attention's 512-bit sums, and the
// AVX2 pieces the avx512 table shares).
namespace avx2 {
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void gelu_tanh_mul(const float* gate, const float* up, int64_t n, float* out);
// attend with attention's dot products and the value sums of lanes [0, d - d % 16) in 512-bit registers.
void attend_wide(Query* qs, int nq, const float* keys, const float* values, int64_t d, float scale, float cap);
}  // namespace avx2
namespace avx512 {
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void gelu_tanh_mul(const float* gate, const float* up, int64_t n, float* out);
// out[j] = avx2's dot(q, keys + rows[j] * d, d) * scale for j in [j0, j1), bit for bit.
void scores(const float* q, const float* keys, const int32_t* rows, int64_t j0, int64_t j1, int64_t d, float scale,
            float* out);
// acc[i] += scores[k] * values[rows[k] * d + i] for k in [k0, k1), in order, for i < d - d % 16.
void add_values(const float* scores, const float* values, const int32_t* rows, int64_t k0, int64_t k1, int64_t d,
                float* acc);
}  // namespace avx512

// The table for a kernel path (gguf_paths.h's ids): scalar where `vec` is false (a size not a multiple of
// 8) or on the scalar path, avx512's on the AVX-512 paths of a CPU that runs it, else avx2's.
const Kernels& pass_kernels(int64_t path, bool vec);

}  // namespace specwise_pass
