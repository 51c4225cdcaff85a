// The weights back to floats, a row at a time: as float32 with the same operations as gguf's reference
// dequantizer (embedding lookups), and as bfloat16 (slabs of a temporary copy for PyTorch's bfloat16 matmul
// on long prompts), with an AVX-512 BF16 copy for every type. Not a dot-product path, hence a file of its
// own; gguf_linear.cpp's entry points split the rows over threads.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "gguf_blocks.h"
#include "gguf_dequantize.h"

// AVX-512 BF16 dequantization of rows straight to bfloat16: the same float32 operations as dequantize_row
// (a multiply, then an addition or subtraction; no fused multiply-add), rounded to nearest even by
// vcvtne2ps2bf16. Only CPUs with native bfloat16 take the bfloat16 route, so only they need it.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
namespace bf16dq {

inline void store32(uint16_t* dst, __m512 lo, __m512 hi) {
  _mm512_storeu_si512(dst, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
}

// 32 unsigned bytes as two vectors of 16 floats.
inline void widen(__m256i bytes, __m512& lo, __m512& hi) {
  lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(bytes)));
  hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(bytes, 1)));
}

// 16 bytes of 4-bit codes as 32 codes in natural order: the low nibbles (values 0-15), then the high ones.
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), m4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}

// Q5_0's / Q5_1's fifth bits (bit j of the word at qh for value j) set into 32 codes.
inline __m256i fifth(__m256i v, const uint8_t* qh) {
  return _mm256_or_si256(v, _mm256_maskz_mov_epi8(load_u32(qh), _mm256_set1_epi8(0x10)));
}

// 32 codes of IQ4_NL / IQ4_XS looked up in kIQ4Values.
inline __m256i iq4(__m256i codes) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
  return _mm256_shuffle_epi8(table, codes);
}

// 32 signed values as floats scaled by d: scale * v, the values 0-15 with lo, 16-31 with hi.
inline void scaled(uint16_t* dst, __m256i v, float lo, float hi) {
  const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v)));
  const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1)));
  store32(dst, _mm512_mul_ps(_mm512_set1_ps(lo), a), _mm512_mul_ps(_mm512_set1_ps(hi), b));
}

// 32 unsigned values u as d * u - m (Minus) or d * u + m, d and m per 16 values (lo, then hi).
template <bool Minus>
inline void affine(uint16_t* dst, __m256i u, float d_lo, float d_hi, float m_lo, float m_hi) {
  __m512 a, b;
  widen(u, a, b);
  a = _mm512_mul_ps(_mm512_set1_ps(d_lo), a);
  b = _mm512_mul_ps(_mm512_set1_ps(d_hi), b);
  if (Minus) store32(dst, _mm512_sub_ps(a, _mm512_set1_ps(m_lo)), _mm512_sub_ps(b, _mm512_set1_ps(m_hi)));
  else store32(dst, _mm512_add_ps(a, _mm512_set1_ps(m_lo)), _mm512_add_ps(b, _mm512_set1_ps(m_hi)));
}

// One row of nb blocks of `type` as bfloat16, with dequantize_row's float32 operations for every type.
bool row(int64_t type, const uint8_t* w, int64_t nb, uint16_t* dst) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
  const int64_t bs = block_bytes(type);
  switch (type) {
    case kQ4_0: case kQ5_0: case kQ8_0: case kIQ4_NL:
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * bs;
        const float d = fp16_to_fp32(blk);
        __m256i v;
        if (type == kQ8_0) v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        else if (type == kQ5_0) v = _mm256_sub_epi8(fifth(nibbles(blk + 6), blk + 2), _mm256_set1_epi8(16));
        else if (type == kQ4_0) v = _mm256_sub_epi8(nibbles(blk + 2), _mm256_set1_epi8(8));
        else v = iq4(nibbles(blk + 2));
        scaled(dst + 32 * b, v, d, d);
      }
      return true;
    case kQ4_1: case kQ5_1:
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * bs;
        const float d = fp16_to_fp32(blk), m = fp16_to_fp32(blk + 2);
        const __m256i u = type == kQ4_1 ? nibbles(blk + 4) : fifth(nibbles(blk + 8), blk + 4);
        affine<false>(dst + 32 * b, u, d, d, m, m);
      }
      return true;
    case kIQ4_XS:
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * bs;
        const float d = fp16_to_fp32(blk);
        int8_t sc[8];
        iq4xs_scales(blk, sc);
        for (int j = 0; j < 8; ++j) {
          const float dl = d * static_cast<float>(sc[j]);
          scaled(dst + 256 * b + 32 * j, iq4(nibbles(blk + 8 + 16 * j)), dl, dl);
        }
      }
      return true;
    case kQ4_K: case kQ5_K:
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * bs;
        const float d = fp16_to_fp32(blk), dmin = fp16_to_fp32(blk + 2);
        uint8_t sc[8], mn[8];
        q4k_scales(blk + 4, sc, mn);
        const __m256i qh = type == kQ5_K ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16))
                                         : _mm256_setzero_si256();  // Q5_K's fifth bits
        for (int j = 0; j < 8; ++j) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (type == kQ4_K ? 16 : 48) + 32 * (j / 2)));
          __m256i q = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4) : _mm256_and_si256(raw, m4);
          if (type == kQ5_K)
            q = _mm256_or_si256(q, _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << j))),
                                                         _mm256_set1_epi8(0x10)));
          const float dj = d * static_cast<float>(sc[j]), mj = dmin * static_cast<float>(mn[j]);
          affine<true>(dst + b * 256 + 32 * j, q, dj, dj, mj, mj);
        }
      }
      return true;
    case kQ2_K:  // value 128h + 32s + l: bits 2s, 2s + 1 of byte 32h + l; scale and min per 16 values
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * bs;
        const float d = fp16_to_fp32(blk + 80), dmin = fp16_to_fp32(blk + 82);
        for (int k = 0; k < 8; ++k) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * (k / 4)));
          const __m256i u = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * (k % 4)), m3);
          const uint8_t p0 = blk[2 * k], p1 = blk[2 * k + 1];
          affine<true>(dst + 256 * b + 32 * k, u, d * static_cast<float>(p0 & 0xF), d * static_cast<float>(p1 & 0xF),
                       dmin * static_cast<float>(p0 >> 4), dmin * static_cast<float>(p1 >> 4));
        }
      }
      return true;
    case kQ3_K:  // Q2_K's crumbs at byte 32, the third bit of value i bit i / 32 of hmask byte i % 32, offset 4
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * bs;
        const float d = fp16_to_fp32(blk + 108);
        int8_t sc[16];
        q3k_scales(blk + 96, sc);
        const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
        for (int k = 0; k < 8; ++k) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 32 * (k / 4)));
          __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * (k % 4)), m3);
          q = _mm256_or_si256(q, _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(hmask, _mm256_set1_epi8(static_cast<char>(1 << k))),
                                                       _mm256_set1_epi8(0x04)));
          scaled(dst + 256 * b + 32 * k, _mm256_sub_epi8(q, _mm256_set1_epi8(4)), d * static_cast<float>(sc[2 * k]),
                 d * static_cast<float>(sc[2 * k + 1]));
        }
      }
      return true;
    case kQ6_K: {
      const __m512 k32 = _mm512_set1_ps(32.f);
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * 210;
        const float d = fp16_to_fp32(blk + 208);
        const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
        for (int h = 0; h < 2; ++h) {
          const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
          const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
          const __m256i q[4] = {
              _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4)),
              _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4)),
          };
          for (int s = 0; s < 4; ++s) {  // values 128h + 32s + l; scales 8h + 2s (l < 16) and 8h + 2s + 1
            __m512 lo, hi;
            widen(q[s], lo, hi);
            const int g = 8 * h + 2 * s;
            const __m512 d0 = _mm512_set1_ps(d * static_cast<float>(sc[g])), d1 = _mm512_set1_ps(d * static_cast<float>(sc[g + 1]));
            store32(dst + b * 256 + 128 * h + 32 * s, _mm512_mul_ps(d0, _mm512_sub_ps(lo, k32)),
                    _mm512_mul_ps(d1, _mm512_sub_ps(hi, k32)));
          }
        }
      }
      return true;
    }
  }
  return false;
}

}  // namespace bf16dq
#pragma GCC pop_options

namespace {

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

}  // namespace

namespace specwise_gguf {

// One row of nb blocks as float32, with the same float32 operations in the same order as gguf's reference
// dequantizer.
void dequantize_row(int64_t type, const uint8_t* row, int64_t nb, float* dst) {
  const int64_t bs = block_bytes(type);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * bs;
    float* y = dst + b * block_values(type);
    if (type == kQ4_K || type == kQ5_K) {
      const float d = fp16_to_fp32(blk), dmin = fp16_to_fp32(blk + 2);
      uint8_t sc[8], mn[8];
      q4k_scales(blk + 4, sc, mn);
      for (int j = 0; j < 8; ++j) {
        const float dj = d * static_cast<float>(sc[j]), mj = dmin * static_cast<float>(mn[j]);
        const uint8_t* src = blk + (type == kQ4_K ? 16 : 48) + 32 * (j / 2);
        for (int l = 0; l < 32; ++l) {
          int u = (src[l] >> ((j & 1) * 4)) & 0xF;
          if (type == kQ5_K) u |= ((blk[16 + l] >> j) & 1) << 4;
          y[32 * j + l] = dj * static_cast<float>(u) - mj;
        }
      }
    } else if (type == kQ2_K) {
      const float d = fp16_to_fp32(blk + 80), dmin = fp16_to_fp32(blk + 82);
      for (int i = 0; i < 256; ++i) {
        const uint8_t packed = blk[i / 16];
        const float dl = d * static_cast<float>(packed & 0xF), ml = dmin * static_cast<float>(packed >> 4);
        y[i] = dl * static_cast<float>(crumb(blk + 16, i)) - ml;
      }
    } else if (type == kQ3_K) {
      const float d = fp16_to_fp32(blk + 108);
      int8_t sc[16];
      q3k_scales(blk + 96, sc);
      for (int i = 0; i < 256; ++i) y[i] = (d * static_cast<float>(sc[i / 16])) * static_cast<float>(q3k_value(blk, i) - 4);
    } else if (type == kIQ4_XS) {
      const float d = fp16_to_fp32(blk);
      int8_t sc[8];
      iq4xs_scales(blk, sc);
      for (int j = 0; j < 8; ++j) {
        uint8_t codes[32];
        nibbles32(blk + 8 + 16 * j, codes);
        const float dl = d * static_cast<float>(sc[j]);
        for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * static_cast<float>(kIQ4Values[codes[l]]);
      }
    } else if (type == kQ4_1 || type == kQ5_1) {
      const float d = fp16_to_fp32(blk), m = fp16_to_fp32(blk + 2);
      uint8_t u[32];
      unsigned_values32(type, blk, u);
      for (int l = 0; l < 32; ++l) y[l] = d * static_cast<float>(u[l]) + m;
    } else if (type == kQ6_K) {
      const float d = fp16_to_fp32(blk + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      for (int h = 0; h < 2; ++h) {  // the layout of q6k_value, a half (128 values) at a time
        const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
        float* yh = y + 128 * h;
        for (int l = 0; l < 32; ++l) {
          const int q0 = (ql[l] & 0xF) | ((qh[l] & 3) << 4), q1 = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
          const int q2 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4), q3 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
          const int g = 8 * h + l / 16;
          yh[l] = (d * static_cast<float>(sc[g])) * static_cast<float>(q0 - 32);
          yh[l + 32] = (d * static_cast<float>(sc[g + 2])) * static_cast<float>(q1 - 32);
          yh[l + 64] = (d * static_cast<float>(sc[g + 4])) * static_cast<float>(q2 - 32);
          yh[l + 96] = (d * static_cast<float>(sc[g + 6])) * static_cast<float>(q3 - 32);
        }
      }
    } else {  // Q4_0, Q5_0, Q8_0, IQ4_NL
      const float d = fp16_to_fp32(blk);
      int8_t v[32];
      signed_values32(type, blk, v);
      for (int l = 0; l < 32; ++l) y[l] = d * static_cast<float>(v[l]);
    }
  }
}

bool dequantize_bf16_simd(int64_t type) { return cpu_has_avx512_bf16() && block_bytes(type) > 0; }

void dequantize_row_bf16(int64_t type, const uint8_t* row, int64_t nb, bool simd, float* scratch, uint16_t* dst) {
  if (simd && bf16dq::row(type, row, nb, dst)) return;
  dequantize_row(type, row, nb, scratch);
  for (int64_t i = 0; i < nb * block_values(type); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &scratch[i], 4);
    dst[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);  // finite weights only
  }
}

}  // namespace specwise_gguf
