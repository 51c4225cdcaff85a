// The decoder pass's element-wise and attention kernels in AVX2 (gguf_pass_kernels.h): every x86-64 CPU the
// SIMD kernel paths run on. Compiled under the AVX2 target pragma; the AVX-512 paths' table shares these
// pieces and calls gguf_pass_avx512.cpp for attention's 512-bit sums.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "gguf_pass_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace specwise_pass {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// e^x to about 1 ulp (exp_poly, gguf_pass_kernels.h).
inline __m256 exp(__m256 x) {
  using namespace exp_poly;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-kClamp)), _mm256_set1_ps(kClamp));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Lo), x);
  __m256 y = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP[i]));
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
}  // namespace

namespace avx2 {

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
}  // namespace avx2

namespace {

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
// wide: the 512-bit sums of gguf_pass_avx512.cpp (same bits), on a CPU with AVX-512.
template <bool wide>
void attend_batch(Query* qs, int nq, const float* keys, const float* values, int64_t d, float scale, float cap) {
  int64_t most = 0;
  for (int b = 0; b < nq; ++b) {
    qs[b].top = -INFINITY;
    most = std::max(most, qs[b].count);
  }
  for (int64_t c0 = 0; c0 < most; c0 += kChunk)
    for (int b = 0; b < nq; ++b) {
      Query& u = qs[b];
      const int64_t end = std::min(c0 + kChunk, u.count);
      if (wide) avx512::scores(u.q, keys, u.rows, c0, end, d, scale, u.scores);
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
      if (wide) avx512::add_values(u.scores, values, u.rows, c0, c1, d, u.acc);
      add_values(u.scores, values, u.rows, c0, c1, d, u.acc, wide ? d - d % 16 : 0);
    }
  for (int b = 0; b < nq; ++b)
    for (int64_t i = 0; i < d; i += 8)
      _mm256_storeu_ps(qs[b].out + i, _mm256_mul_ps(_mm256_loadu_ps(qs[b].acc + i), _mm256_set1_ps(qs[b].inv)));
}

}  // namespace

namespace avx2 {

void attend(Query* qs, int nq, const float* keys, const float* values, int64_t d, float scale, float cap) {
  attend_batch<false>(qs, nq, keys, values, d, scale, cap);
}

void attend_wide(Query* qs, int nq, const float* keys, const float* values, int64_t d, float scale, float cap) {
  attend_batch<true>(qs, nq, keys, values, d, scale, cap);
}

}  // namespace avx2
}  // namespace specwise_pass
#pragma GCC pop_options

namespace specwise_pass::avx2 {
const Kernels kernels = {rms_norm, silu_mul, gelu_tanh_mul, attend};
}  // namespace specwise_pass::avx2
