// The decoder pass's attention sums in 512-bit registers (gguf_pass_kernels.h), for the AVX-512 paths: two
// keys' dot products or 16 lanes of value sums per instruction, each lane doing gguf_pass_avx2.cpp's
// operations in its order, so the same bits. Every AVX-512 instruction of the pass is in this file's target
// region; usable() and the table stand outside it, so that they run on every CPU.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "gguf_pass_kernels.h"

namespace specwise_pass::avx512 {

bool usable() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return ok;
}

// The AVX2 table with the activations and attention's sums in 512-bit registers.
const Kernels kernels = {avx2::rms_norm, silu_mul, gelu_tanh_mul, avx2::attend_wide};

}  // namespace specwise_pass::avx512

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
namespace specwise_pass {
namespace {

// Query lanes 8c..8c+7 in both 256-bit halves, and keys y and z side by side.
inline __m512 both(const float* x) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(x)); }
inline __m512 pair(const float* y, const float* z) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(y)), _mm256_loadu_ps(z), 1);
}

// avx2's exp (gguf_pass_avx2.cpp) over 16 lanes: the same operations lane by lane, so the same bits.
inline __m512 exp16(__m512 x) {
  using namespace exp_poly;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-kClamp)), _mm512_set1_ps(kClamp));
  const __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f)),
                                         _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(kLn2Hi), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(kLn2Lo), x);
  __m512 y = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kP[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

// avx2's add_lanes over 16 lanes a register: acc[16c + l] += scores[k] * values[rows[k] * d + 16c + l].
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

// out[j] = avx2's dot(q, keys + rows[j] * d, d) * scale for j in [j0, j1), two keys a register (lanes 0-7 the
// first key's, 8-15 the second's), and each half reduced as avx2's hsum reduces its register.
void scores_pairs(const float* q, const float* keys, const int32_t* rows, int64_t j0, int64_t j1, int64_t d,
                  float scale, float* out) {
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

// The same scores 16 keys at a time with the query in C = d / 16 registers: key k's register a[k] holds in
// lanes 0-7 avx2's first accumulator and in lanes 8-15 its second (the same chains of products), and one
// tree of shuffles and adds then pairs the lanes as avx2's a0 + a1 and hsum do (l with l + 8, then l + 4,
// l + 2, l + 1), 16 keys at once: no key is loaded twice and no register reduced alone.
template <int C>
void scores_16(const float* q, const float* keys, const int32_t* rows, int64_t j0, int64_t j1, int64_t d, float scale,
               float* out) {
  __m512 qc[C];
  for (int c = 0; c < C; ++c) qc[c] = _mm512_loadu_ps(q + 16 * c);
  // Lane 4 b + c of the tree's result holds key 4 c + b.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t j = j0; j < j1; j += 16) {
    const int64_t count = std::min<int64_t>(16, j1 - j);
    __m512 a[16];
    for (int k = 0; k < 16; ++k) {
      const float* key = keys + rows[j + std::min<int64_t>(k, count - 1)] * d;  // past the end: the last key again
      a[k] = _mm512_fmadd_ps(qc[0], _mm512_loadu_ps(key), _mm512_setzero_ps());
      for (int c = 1; c < C; ++c) a[k] = _mm512_fmadd_ps(qc[c], _mm512_loadu_ps(key + 16 * c), a[k]);
    }
    __m512 p[8], t[4], u[2];
    for (int k = 0; k < 8; ++k)  // lanes l + l + 8: keys 2k, 2k + 1 in the two halves
      p[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x44),
                           _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; ++k)  // + lanes l + 4: keys 4k .. 4k + 3 in the four 128-bit blocks
      t[k] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], 0x88),
                           _mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; ++k)  // + lanes l + 2
      u[k] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),  // + lane l + 1
                                   _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 s = _mm512_mul_ps(_mm512_permutexvar_ps(order, w), vscale);
    _mm512_mask_storeu_ps(out + j, static_cast<__mmask16>((1u << count) - 1), s);
  }
}

}  // namespace

namespace avx512 {

// avx2's silu_mul and gelu_tanh_mul 16 values at a time (the same operations, so the same bits); avx2's take
// the last 8 when n % 16 == 8. The division stays: a reciprocal's estimate would change the bits.
void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.f), zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(zero, g))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  if (i < n) avx2::silu_mul(gate + i, up + i, n - i, out + i);
}

void gelu_tanh_mul(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.f), zero = _mm512_setzero_ps();
  const __m512 beta2 = _mm512_set1_ps(2.f * 0.7978845608028654f), kappa = _mm512_set1_ps(0.044715f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 u2 = _mm512_mul_ps(beta2, _mm512_fmadd_ps(kappa, _mm512_mul_ps(g, _mm512_mul_ps(g, g)), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(zero, u2))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  if (i < n) avx2::gelu_tanh_mul(gate + i, up + i, n - i, out + i);
}

void scores(const float* q, const float* keys, const int32_t* rows, int64_t j0, int64_t j1, int64_t d, float scale,
            float* out) {
  switch (d % 16 == 0 ? d / 16 : 0) {
    case 4: scores_16<4>(q, keys, rows, j0, j1, d, scale, out); break;
    case 5: scores_16<5>(q, keys, rows, j0, j1, d, scale, out); break;
    case 6: scores_16<6>(q, keys, rows, j0, j1, d, scale, out); break;
    case 7: scores_16<7>(q, keys, rows, j0, j1, d, scale, out); break;
    case 8: scores_16<8>(q, keys, rows, j0, j1, d, scale, out); break;
    default: scores_pairs(q, keys, rows, j0, j1, d, scale, out); break;
  }
}

// add_lanes over the lanes [0, d - d % 16); avx2's add_values takes the last 8 when d % 16 == 8.
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

}  // namespace avx512
}  // namespace specwise_pass
#pragma GCC pop_options
