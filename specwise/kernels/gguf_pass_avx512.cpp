// The decoder pass's attention sums in 512-bit registers (gguf_pass_kernels.h), for the AVX-512 paths: two
// keys' dot products or 16 lanes of value sums per instruction, each lane doing gguf_pass_avx2.cpp's
// operations in its order, so the same bits. Every AVX-512 instruction of the pass is in this file's target
// region; usable() and the table stand outside it, so that they run on every CPU.
#include <immintrin.h>

#include <cstdint>

#include "gguf_pass_kernels.h"

namespace specwise_pass::avx512 {

bool usable() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return ok;
}

// The AVX2 table with attention's sums in 512-bit registers.
const Kernels kernels = {avx2::rms_norm, avx2::silu_mul, avx2::gelu_tanh_mul, avx2::attend_wide};

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

}  // namespace

namespace avx512 {

// out[j] = avx2's dot(q, keys + rows[j] * d, d) * scale for j in [j0, j1), two keys a register (lanes 0-7 the
// first key's, 8-15 the second's), and each half reduced as avx2's hsum reduces its register.
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
