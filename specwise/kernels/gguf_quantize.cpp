// Activation quantization: each row of x to int8 per block of the weight, with its scale and block sums, in
// the layouts of gguf_activations.h. The reference (ScalarQuant) and its AVX2 and AVX-512 copies sit side by
// side because they must compute the same float operations (every path sees the same int8 values); the tiles
// of every path then read the same bytes. The SIMD copies are compiled under target pragmas, as the tiles are.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gguf_activations.h"
#include "gguf_blocks.h"
#include "gguf_paths.h"
#include "gguf_quantize.h"

namespace {

// Symmetric int8 quantization of one block: q = round_half_even(x * (127 / amax)), d = amax / 127.
// Every path computes exactly these float operations, so all paths see the same q and d. A non-finite
// input makes d NaN, so the row's outputs are NaN rather than silently finite.
struct ScalarQuant {
  static constexpr bool kWholeK = false;  // no block_k: quantize_row_k fills an ActK field by field
  static float block(const float* x, int64_t len, int8_t* q) {
    float amax = 0.f, poison = 0.f;
    for (int64_t i = 0; i < len; ++i) {
      const float a = std::fabs(x[i]);
      amax = a > amax ? a : amax;
      poison += x[i] * 0.f;  // NaN once any x is infinite or NaN
    }
    if (!(poison == 0.f)) {
      std::memset(q, 0, len);
      return std::numeric_limits<float>::quiet_NaN();
    }
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding it rounds |v| < 2^22 to an integer, ties to even
    for (int64_t i = 0; i < len; ++i) q[i] = static_cast<int8_t>(static_cast<int>((x[i] * id + kRound) - kRound));
    return amax / 127.f;
  }
};

template <class Quant>
void quantize_row_k(const float* x, int64_t in, ActK* out) {
  for (int64_t b = 0; b < in / 256; ++b) {
    ActK& a = out[b];
    if constexpr (Quant::kWholeK) {  // the block's bytes all at once, in registers
      if (Quant::block_k(x + b * 256, a)) continue;
    }
    a.d = Quant::block(x + b * 256, 256, a.q);
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += a.q[16 * j + l];
      a.bsum16[j] = static_cast<int16_t>(s);
    }
    for (int j = 0; j < 8; ++j) a.bsum32[j] = static_cast<int16_t>(a.bsum16[2 * j] + a.bsum16[2 * j + 1]);
    std::memset(a.pad, 0, sizeof(a.pad));
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 4; ++k) std::memcpy(a.qt + 64 * j + 16 * k, a.q + 64 * k + 16 * j, 16);
  }
}

template <class Quant>
void quantize_row_32(const float* x, int64_t in, int32_t offset, Act32* out) {
  const int64_t blocks = in / 32;
  for (int64_t p = 0; p < (blocks + 1) / 2; ++p) {
    Act32& a = out[p];
    std::memset(&a, 0, sizeof(a));
    for (int h = 0; h < 2 && 2 * p + h < blocks; ++h) {
      const float d = Quant::block(x + (2 * p + h) * 32, 32, a.q + 32 * h);
      int s = 0;
      for (int l = 0; l < 32; ++l) s += a.q[32 * h + l];
      a.corr[8 * h] = -offset * s;
      for (int l = 0; l < 8; ++l) a.d[8 * h + l] = d;
    }
  }
}

template <class Quant>
void quantize_rows(int64_t type, const float* x, int64_t n, int64_t in, uint8_t* act, int64_t stride) {
  // Threads only for prefill-sized inputs: for a few rows a parallel region costs more than the work.
  at::parallel_for(0, n, std::max<int64_t>(1, (int64_t{1} << 16) / in), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (super_block(type)) quantize_row_k<Quant>(x + r * in, in, reinterpret_cast<ActK*>(act + r * stride));
      else quantize_row_32<Quant>(x + r * in, in, act32_offset(type), reinterpret_cast<Act32*>(act + r * stride));
    }
  });
}

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {

// The same float operations as ScalarQuant::block, eight values at a time.
struct Quant {
  static constexpr bool kWholeK = false;
  static float block(const float* x, int64_t len, int8_t* q) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 mx = _mm256_setzero_ps();
    int bad = 0;
    for (int64_t i = 0; i < len; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i), z = _mm256_mul_ps(v, _mm256_setzero_ps());
      bad |= _mm256_movemask_ps(_mm256_cmp_ps(z, z, _CMP_UNORD_Q));
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
    }
    if (bad) {
      std::memset(q, 0, len);
      return std::numeric_limits<float>::quiet_NaN();
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < len; i += 32) {  // rounds to nearest even (the default MXCSR mode)
      const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vid));
      const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vid));
      const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vid));
      const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vid));
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permutevar8x32_epi32(packed, order));
    }
    return amax / 127.f;
  }
};

}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
namespace avx512 {

// The same float operations as ScalarQuant::block, sixteen values at a time.
struct Quant {
  static float block(const float* x, int64_t len, int8_t* q) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int64_t i = 0; i < len; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i), z = _mm512_mul_ps(v, _mm512_setzero_ps());
      bad |= _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q);
      mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    if (bad) {
      std::memset(q, 0, len);
      return std::numeric_limits<float>::quiet_NaN();
    }
    const float amax = _mm512_reduce_max_ps(mx);
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    const __m512 vid = _mm512_set1_ps(id);
    for (int64_t i = 0; i < len; i += 16)  // rounds to nearest even (the default MXCSR mode)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                       _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vid))));
    return amax / 127.f;
  }

  // A whole ActK from 256 values, its q from block's operations and the rest from q in registers (the
  // field-by-field way stores q 16 bytes at a time and reads it back a byte or 16 at a time, several times
  // the arithmetic). False, with nothing written, for a non-finite input: block's way writes that case.
  static constexpr bool kWholeK = true;
  static bool block_k(const float* x, ActK& a) {
    __m512 v[16];
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int i = 0; i < 16; ++i) {
      v[i] = _mm512_loadu_ps(x + 16 * i);
      const __m512 z = _mm512_mul_ps(v[i], _mm512_setzero_ps());
      bad |= _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q);
      mx = _mm512_max_ps(mx, _mm512_abs_ps(v[i]));
    }
    if (bad) return false;
    const float amax = _mm512_reduce_max_ps(mx);
    const __m512 vid = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    __m512i q[4];  // q[k]: values 64 k .. 64 k + 63
    for (int k = 0; k < 4; ++k) {
      __m512i r = _mm512_castsi128_si512(_mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v[4 * k], vid))));
      for (int i = 1; i < 4; ++i)
        r = _mm512_inserti32x4(r, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v[4 * k + i], vid))), i);
      q[k] = r;
      _mm512_storeu_si512(a.q + 64 * k, r);
    }
    a.d = amax / 127.f;
    // Sums of 8 bytes each as unsigned (q + 128) by vpsadbw, 1024 over; pairs of them make the 16-value
    // sums and pairs of those the 32-value ones.
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80)), zero = _mm512_setzero_si512();
    const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    __m512i s[4], u[2];
    for (int k = 0; k < 4; ++k) s[k] = _mm512_sad_epu8(_mm512_xor_si512(q[k], flip), zero);
    for (int h = 0; h < 2; ++h) {
      u[h] = _mm512_sub_epi64(_mm512_add_epi64(_mm512_permutex2var_epi64(s[2 * h], even, s[2 * h + 1]),
                                               _mm512_permutex2var_epi64(s[2 * h], odd, s[2 * h + 1])),
                              _mm512_set1_epi64(2048));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.bsum16 + 8 * h), _mm512_cvtepi64_epi16(u[h]));
    }
    const __m512i w = _mm512_add_epi64(_mm512_permutex2var_epi64(u[0], even, u[1]), _mm512_permutex2var_epi64(u[0], odd, u[1]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.bsum32), _mm512_cvtepi64_epi16(w));
    std::memset(a.pad, 0, sizeof(a.pad));
    // qt: the 16-byte units as a 4x4 matrix transposed, qt[64 j + 16 k + i] = q[64 k + 16 j + i].
    const __m512i t0 = _mm512_shuffle_i64x2(q[0], q[1], 0x44), t1 = _mm512_shuffle_i64x2(q[0], q[1], 0xEE);
    const __m512i t2 = _mm512_shuffle_i64x2(q[2], q[3], 0x44), t3 = _mm512_shuffle_i64x2(q[2], q[3], 0xEE);
    _mm512_storeu_si512(a.qt, _mm512_shuffle_i64x2(t0, t2, 0x88));
    _mm512_storeu_si512(a.qt + 64, _mm512_shuffle_i64x2(t0, t2, 0xDD));
    _mm512_storeu_si512(a.qt + 128, _mm512_shuffle_i64x2(t1, t3, 0x88));
    _mm512_storeu_si512(a.qt + 192, _mm512_shuffle_i64x2(t1, t3, 0xDD));
    return true;
  }
};

}  // namespace avx512
#pragma GCC pop_options

namespace specwise_gguf {

int activation_kind(int64_t type) { return ::activation_kind(type); }

int64_t activation_kind_type(int kind) { return kind == 0 ? kQ4_K : kind == 1 ? kQ5_0 : kQ8_0; }

int64_t activation_stride(int64_t type, int64_t in_features) {
  const int64_t nb = in_features / ::block_values(type);
  return super_block(type) ? nb * int64_t{sizeof(ActK)} : (nb + 1) / 2 * int64_t{sizeof(Act32)};
}

void quantize_rows_serial(int64_t path, int64_t type, const float* x, int64_t r0, int64_t r1, int64_t in_features,
                          uint8_t* act, int64_t stride) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * in_features;
    uint8_t* out = act + r * stride;
    const bool k = super_block(type);
    const int32_t offset = act32_offset(type);
    if (simd_path(path) == kAvx512) {
      if (k) quantize_row_k<avx512::Quant>(xr, in_features, reinterpret_cast<ActK*>(out));
      else quantize_row_32<avx512::Quant>(xr, in_features, offset, reinterpret_cast<Act32*>(out));
    } else if (path == kAvx2) {
      if (k) quantize_row_k<avx2::Quant>(xr, in_features, reinterpret_cast<ActK*>(out));
      else quantize_row_32<avx2::Quant>(xr, in_features, offset, reinterpret_cast<Act32*>(out));
    } else {
      if (k) quantize_row_k<ScalarQuant>(xr, in_features, reinterpret_cast<ActK*>(out));
      else quantize_row_32<ScalarQuant>(xr, in_features, offset, reinterpret_cast<Act32*>(out));
    }
  }
}

void quantize_rows(int64_t path, int64_t type, const float* x, int64_t n, int64_t in_features, uint8_t* act,
                   int64_t stride) {
  if (simd_path(path) == kAvx512) ::quantize_rows<avx512::Quant>(type, x, n, in_features, act, stride);
  else if (path == kAvx2) ::quantize_rows<avx2::Quant>(type, x, n, in_features, act, stride);
  else ::quantize_rows<ScalarQuant>(type, x, n, in_features, act, stride);
}

}  // namespace specwise_gguf
