// The portable scalar path: the reference semantics of the SIMD paths, one weight row and one activation row
// at a time, in plain C++ for any CPU. A file of its own so that the reference reads apart from the
// intrinsics: gguf_avx2.cpp and gguf_avx512.cpp compute the same integer sums per block.
#include <cstdint>

#include "gguf_activations.h"
#include "gguf_blocks.h"
#include "gguf_paths.h"

namespace {

// Q4_K and Q5_K: eight 32-value sub-blocks with a 6-bit scale and min each, w = d * sc * u - dmin * mn.
template <int64_t Type>
float dot_q4k_scalar(const uint8_t* w, int64_t nb, const ActK* act) {
  constexpr int64_t kQs = Type == kQ4_K ? 16 : 48;  // Q5_K: 32 bytes of fifth bits first
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * block_bytes(Type);
    const ActK& a = act[b];
    const float d = fp16_to_fp32(blk), dmin = fp16_to_fp32(blk + 2);
    uint8_t sc[8], mn[8];
    q4k_scales(blk + 4, sc, mn);
    const uint8_t* qs = blk + kQs;
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      const int shift = (j & 1) * 4;
      const uint8_t* src = qs + 32 * (j / 2);
      int32_t s = 0;
      for (int l = 0; l < 32; ++l) {
        int u = (src[l] >> shift) & 0xF;
        if constexpr (Type == kQ5_K) u |= ((blk[16 + l] >> j) & 1) << 4;  // bit j of byte l
        s += u * a.q[32 * j + l];
      }
      isum += sc[j] * s;
      msum += mn[j] * a.bsum32[j];
    }
    acc += (d * a.d) * static_cast<float>(isum);
    acc -= (dmin * a.d) * static_cast<float>(msum);
  }
  return acc;
}

float dot_q6k_scalar(const uint8_t* w, int64_t nb, const ActK* act) {
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * 210;
    const ActK& a = act[b];
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = fp16_to_fp32(blk + 208);
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) s += q6k_value(blk, blk + 128, 16 * g + l) * a.q[16 * g + l];
      isum += sc[g] * (s - 32 * a.bsum16[g]);
    }
    acc += (d * a.d) * static_cast<float>(isum);
  }
  return acc;
}

// Q3_K: sixteen 16-value sub-blocks, w = d * sc * (u - 4), as Q6_K with another offset.
float dot_q3k_scalar(const uint8_t* w, int64_t nb, const ActK* act) {
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * 110;
    const ActK& a = act[b];
    int8_t sc[16];
    q3k_scales(blk + 96, sc);
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) s += q3k_value(blk, 16 * g + l) * a.q[16 * g + l];
      isum += sc[g] * (s - 4 * a.bsum16[g]);
    }
    acc += (fp16_to_fp32(blk + 108) * a.d) * static_cast<float>(isum);
  }
  return acc;
}

// Q2_K: sixteen 16-value sub-blocks with a 4-bit scale and min each (low and high nibble of byte g),
// w = d * sc * u - dmin * mn.
float dot_q2k_scalar(const uint8_t* w, int64_t nb, const ActK* act) {
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * 84;
    const ActK& a = act[b];
    const float d = fp16_to_fp32(blk + 80), dmin = fp16_to_fp32(blk + 82);
    int32_t isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) s += crumb(blk + 16, 16 * g + l) * a.q[16 * g + l];
      isum += (blk[g] & 0xF) * s;
      msum += (blk[g] >> 4) * a.bsum16[g];
    }
    acc += (d * a.d) * static_cast<float>(isum);
    acc -= (dmin * a.d) * static_cast<float>(msum);
  }
  return acc;
}

// IQ4_XS: eight 32-value sub-blocks with a 6-bit signed scale each, w = d * sc * kIQ4Values[code]; sub-block
// j's codes are the 16 bytes at 8 + 16j, laid out as a 32-value block's.
float dot_iq4xs_scalar(const uint8_t* w, int64_t nb, const ActK* act) {
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * 136;
    const ActK& a = act[b];
    int8_t sc[8];
    iq4xs_scales(blk, sc);
    int32_t isum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t codes[32];
      nibbles32(blk + 8 + 16 * j, codes);
      int32_t s = 0;
      for (int l = 0; l < 32; ++l) s += kIQ4Values[codes[l]] * a.q[32 * j + l];
      isum += sc[j] * s;
    }
    acc += (fp16_to_fp32(blk) * a.d) * static_cast<float>(isum);
  }
  return acc;
}

// The 32-value types with signed weights d * v (Q4_0, Q5_0, Q8_0, IQ4_NL).
template <int64_t Type>
float dot_32_scalar(const uint8_t* w, int64_t nb, const Act32* act) {
  constexpr int64_t bs = block_bytes(Type);
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * bs;
    const Act32& a = act[b / 2];
    const int h = static_cast<int>(b & 1);
    int8_t v[32];
    signed_values32(Type, blk, v);
    int32_t isum = 0;
    for (int l = 0; l < 32; ++l) isum += v[l] * a.q[32 * h + l];
    acc += (fp16_to_fp32(blk) * a.d[8 * h]) * static_cast<float>(isum);
  }
  return acc;
}

// The 32-value types with a min, d * u + m (Q4_1, Q5_1): the min multiplies the block's sum of activations.
template <int64_t Type>
float dot_32min_scalar(const uint8_t* w, int64_t nb, const Act32* act) {
  constexpr int64_t bs = block_bytes(Type);
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * bs;
    const Act32& a = act[b / 2];
    const int h = static_cast<int>(b & 1);
    uint8_t u[32];
    unsigned_values32(Type, blk, u);
    int32_t isum = 0;
    for (int l = 0; l < 32; ++l) isum += u[l] * a.q[32 * h + l];
    acc += (fp16_to_fp32(blk) * a.d[8 * h]) * static_cast<float>(isum);
    acc += (fp16_to_fp32(blk + 2) * a.d[8 * h]) * static_cast<float>(act32_sum(a, h));
  }
  return acc;
}

}  // namespace

namespace scalar {

void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
          const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* wr = w + o * row_bytes;
    for (int64_t r = 0; r < nrows; ++r) {
      const uint8_t* row = act + r * stride;
      float v = 0.f;
      switch (type) {
        case kQ4_K: v = dot_q4k_scalar<kQ4_K>(wr, nb, reinterpret_cast<const ActK*>(row)); break;
        case kQ5_K: v = dot_q4k_scalar<kQ5_K>(wr, nb, reinterpret_cast<const ActK*>(row)); break;
        case kQ6_K: v = dot_q6k_scalar(wr, nb, reinterpret_cast<const ActK*>(row)); break;
        case kQ3_K: v = dot_q3k_scalar(wr, nb, reinterpret_cast<const ActK*>(row)); break;
        case kQ2_K: v = dot_q2k_scalar(wr, nb, reinterpret_cast<const ActK*>(row)); break;
        case kIQ4_XS: v = dot_iq4xs_scalar(wr, nb, reinterpret_cast<const ActK*>(row)); break;
        case kQ4_0: v = dot_32_scalar<kQ4_0>(wr, nb, reinterpret_cast<const Act32*>(row)); break;
        case kQ5_0: v = dot_32_scalar<kQ5_0>(wr, nb, reinterpret_cast<const Act32*>(row)); break;
        case kQ8_0: v = dot_32_scalar<kQ8_0>(wr, nb, reinterpret_cast<const Act32*>(row)); break;
        case kIQ4_NL: v = dot_32_scalar<kIQ4_NL>(wr, nb, reinterpret_cast<const Act32*>(row)); break;
        case kQ4_1: v = dot_32min_scalar<kQ4_1>(wr, nb, reinterpret_cast<const Act32*>(row)); break;
        case kQ5_1: v = dot_32min_scalar<kQ5_1>(wr, nb, reinterpret_cast<const Act32*>(row)); break;
      }
      y[r * ldy + o] = v;
    }
  }
}

}  // namespace scalar
