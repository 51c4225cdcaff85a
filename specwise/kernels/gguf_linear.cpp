// y = x @ W.T (+ bias) where W is a GGUF tensor kept in its stored block format: Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, IQ4_NL (32-value blocks), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (256-value blocks).
//
// Why: a decoding pass over a few rows is bound by reading the weights. Executing the stored 2-8 bit
// blocks reads a third of the bytes of a bfloat16 copy or less, and unpacking each block once for every
// row held in registers keeps each extra row cheap (what speculative verification needs).
//
// How: every activation row is quantized to int8, per 256 values for the 256-value types and per 32 for
// the others, with a float scale and the block sums that offsets and mins need (the llama.cpp "Q8_K"
// idea). A weight block is unpacked once to bytes (unsigned, or signed with the sign moved onto the
// activation), then each row takes integer dot products with it (AVX-512 VNNI: vpdpbusd / vpdpwssd;
// AVX2: vpmaddubsw + vpmaddwd; a portable scalar path), applies the weight's integer sub-block scales in
// integers and the block's float scales (and min) once per block.
//
// Paths: Q4_K, Q6_K, Q5_0 and Q8_0 have AVX-512 tiles; the other types have none yet, and AVX-512 CPUs run
// their AVX2 tiles, on the same activations.
//
// Row independence: a row's activation scales come from that row alone, and its arithmetic is the same
// sequence of operations whatever the number of rows in the call, so out[i] is bit-identical to a call
// with row i alone. Threads split output features only, never one dot product's reduction. The three
// paths quantize activations identically and compute the same integer sums per block; they add the
// float terms in different orders, so they agree with each other only to float32 rounding.
//
// The SIMD paths are compiled for their instruction sets with target pragmas and chosen at run time, so
// one binary runs on any x86-64 CPU. The build must not use -ffast-math (it would reassociate sums) and
// uses -ffp-contract=off so that scalar float expressions round the same way everywhere.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "gguf_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

// ggml type ids (ggml.h); anything else is rejected by the Python wrapper and here.
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12,
                  kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23;
enum Path : int64_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

constexpr int64_t kRowChunk = 64;  // rows whose quantized activations stay in L2 while the weights stream by

constexpr int64_t block_bytes(int64_t type) {
  switch (type) {
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    case kQ5_0: return 22;
    case kQ5_1: return 24;
    case kQ8_0: return 34;
    case kQ2_K: return 84;
    case kQ3_K: return 110;
    case kQ4_K: return 144;
    case kQ5_K: return 176;
    case kQ6_K: return 210;
    case kIQ4_NL: return 18;
    case kIQ4_XS: return 136;
  }
  return 0;
}
// The K-quants and IQ4_XS hold 256 values a block (super-blocks of 16- or 32-value sub-blocks), the rest 32.
constexpr bool super_block(int64_t type) {
  return type == kQ2_K || type == kQ3_K || type == kQ4_K || type == kQ5_K || type == kQ6_K || type == kIQ4_XS;
}
constexpr int64_t block_values(int64_t type) { return super_block(type) ? 256 : 32; }

// The activation layout a type reads (kActivationKinds of them): 0, ActK (every 256-value type); 1, Act32
// for Q5_0 (offset 16); 2, Act32 for Q8_0 and every other 32-value type (offset 128: Q4_0 and IQ4_NL ignore
// it, Q4_1 and Q5_1 read their blocks' sums of q from it).
constexpr int activation_kind(int64_t type) { return super_block(type) ? 0 : type == kQ5_0 ? 1 : 2; }
constexpr int32_t act32_offset(int64_t type) { return type == kQ5_0 ? 16 : 128; }

// The 16 values of IQ4_NL and IQ4_XS's 4-bit codes (ggml's kvalues_iq4nl).
alignas(16) constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

inline float fp16_to_fp32(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant * 2^-24 is exact in float32
      const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
      std::memcpy(&bits, &v, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_K's twelve scale bytes hold eight 6-bit scales and eight 6-bit mins.
inline void q4k_scales(const uint8_t* s, uint8_t sc[8], uint8_t mn[8]) {
  const uint32_t a = load_u32(s), b = load_u32(s + 4), c = load_u32(s + 8);
  const uint32_t sc_lo = a & 0x3f3f3f3fu, mn_lo = b & 0x3f3f3f3fu;
  const uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
  const uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
  std::memcpy(sc, &sc_lo, 4);
  std::memcpy(sc + 4, &sc_hi, 4);
  std::memcpy(mn, &mn_lo, 4);
  std::memcpy(mn + 4, &mn_hi, 4);
}

// Q3_K's twelve scale bytes hold sixteen 6-bit scales, stored with an offset of 32.
inline void q3k_scales(const uint8_t* s, int8_t sc[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = (s[j % 8] >> (4 * (j / 8))) & 0xF, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

// IQ4_XS's eight 6-bit sub-block scales (offset 32): four low bits in bytes 4-7, two high bits in bytes 2-3.
inline void iq4xs_scales(const uint8_t* blk, int8_t sc[8]) {
  const unsigned high = blk[2] | (blk[3] << 8);
  for (int j = 0; j < 8; ++j) {
    const unsigned lo = (blk[4 + j / 2] >> (4 * (j % 2))) & 0xFu, hi = (high >> (2 * j)) & 3u;
    sc[j] = static_cast<int8_t>(static_cast<int>(lo | (hi << 4)) - 32);
  }
}

// The 32 weights of a 32-value block as integers: signed for Q4_0, Q5_0, Q8_0 and IQ4_NL (the weight is
// d * v), unsigned for Q4_1 and Q5_1 (d * v + m). The 4-bit codes of value j < 16 are the low nibble of
// byte j, of value j + 16 its high nibble; Q5_0 / Q5_1 add bit j of a 32-bit word as the fifth bit.
inline void nibbles32(const uint8_t* qs, uint8_t out[32]) {
  for (int j = 0; j < 16; ++j) {
    out[j] = qs[j] & 0xF;
    out[j + 16] = qs[j] >> 4;
  }
}

inline void fifth_bits32(const uint8_t* qh, uint8_t v[32]) {
  const uint32_t bits = load_u32(qh);
  for (int j = 0; j < 32; ++j) v[j] = static_cast<uint8_t>(v[j] | (((bits >> j) & 1) << 4));
}

inline void signed_values32(int64_t type, const uint8_t* blk, int8_t out[32]) {
  uint8_t u[32];
  if (type == kQ8_0) {
    std::memcpy(out, blk + 2, 32);
    return;
  }
  nibbles32(type == kQ5_0 ? blk + 6 : blk + 2, u);
  if (type == kQ5_0) fifth_bits32(blk + 2, u);
  for (int j = 0; j < 32; ++j)
    out[j] = type == kIQ4_NL ? kIQ4Values[u[j]] : static_cast<int8_t>(u[j] - (type == kQ5_0 ? 16 : 8));
}

inline void unsigned_values32(int64_t type, const uint8_t* blk, uint8_t out[32]) {
  nibbles32(type == kQ5_1 ? blk + 8 : blk + 4, out);
  if (type == kQ5_1) fifth_bits32(blk + 4, out);
}

// ---------------------------------------------------------------------------------------------
// Quantized activations (shared by all paths, so every path sees the same int8 values).

// One 256-value block for the K-quants. 320 bytes keeps q 64-byte aligned in an aligned buffer.
struct ActK {
  int8_t q[256];
  int16_t bsum16[16];  // sums of q over each 16 values (Q6_K's offset of 32)
  int16_t bsum32[8];   // sums over each 32 values (Q4_K's mins)
  float d;
  int32_t pad[3];
  // q again, its 16-byte units transposed as a 4x4 matrix: qt[64j + 16k + i] = q[64k + 16j + i]. The
  // AVX-512 Q4_K path multiplies in this order (see avx512::Q4K).
  int8_t qt[256];
};
static_assert(sizeof(ActK) == 576, "ActK layout");

// Two 32-value blocks for Q5_0 / Q8_0, laid out for one 512-bit register.
struct Act32 {
  int8_t q[64];
  int32_t corr[16];  // -offset * (sum of q) in lanes 0 and 8: the unsigned weights' offset, per block
  float d[16];       // the two blocks' scales, each repeated over its 8 lanes
};
static_assert(sizeof(Act32) == 192, "Act32 layout");

// Symmetric int8 quantization of one block: q = round_half_even(x * (127 / amax)), d = amax / 127.
// Every path computes exactly these float operations, so all paths see the same q and d. A non-finite
// input makes d NaN, so the row's outputs are NaN rather than silently finite.
struct ScalarQuant {
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

// Side data of one tile of K-quant activation rows, for float work with lanes = rows (the SIMD paths'
// Q4K and Q6K derive from it): per block, the rows' activation scales in W float lanes (Dup: a tile of up
// to W/2 rows also in the upper half), then with Pairs, for j < 4, the rows' word pairs (bsum32[2j],
// bsum32[2j + 1]) as W dwords, which the Q4_K mins multiply. Lanes of missing rows are zero.
template <int W, bool Pairs, bool Dup = false>
struct TileSide {
  static constexpr int64_t kSide = 4 * W * (Pairs ? 5 : 1);  // bytes per block
  static void prepare(const uint8_t* act, int64_t stride, int rows, int64_t nb, uint8_t* side) {
    for (int64_t b = 0; b < nb; ++b) {
      float* d = reinterpret_cast<float*>(side + b * kSide);
      std::memset(d, 0, kSide);
      for (int r = 0; r < rows; ++r) {
        const ActK* a = reinterpret_cast<const ActK*>(act + r * stride) + b;
        d[r] = a->d;
        if (Dup && rows <= W / 2) d[r + W / 2] = a->d;
        if constexpr (Pairs) {
          uint32_t* bs = reinterpret_cast<uint32_t*>(d + W);
          for (int j = 0; j < 4; ++j)
            bs[W * j + r] = static_cast<uint16_t>(a->bsum32[2 * j]) |
                            static_cast<uint32_t>(static_cast<uint16_t>(a->bsum32[2 * j + 1])) << 16;
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Portable scalar path: the reference semantics of the SIMD paths, one row at a time.

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

inline int q6k_value(const uint8_t* ql, const uint8_t* qh, int idx) {
  const int h = idx / 128, r = idx % 128, s = r / 32, l = r % 32;
  const uint8_t lo = ql[64 * h + 32 * (s & 1) + l];
  const int nib = s >= 2 ? (lo >> 4) : (lo & 0xF);
  return nib | (((qh[32 * h + l] >> (2 * s)) & 3) << 4);  // 0..63, offset 32
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

// Q2_K's and Q3_K's 2-bit codes: value 128h + 32s + l is bits 2s, 2s + 1 of byte 32h + l.
inline int crumb(const uint8_t* qs, int idx) { return (qs[32 * (idx / 128) + idx % 32] >> (2 * (idx % 128 / 32))) & 3; }

// Q3_K: 0..7 (offset 4), the third bit being bit idx / 32 of hmask byte idx % 32.
inline int q3k_value(const uint8_t* blk, int idx) {
  return crumb(blk + 32, idx) | (((blk[idx % 32] >> (idx / 32)) & 1) << 2);
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

// The block's sum of activation codes, which Act32 holds for offset 128 as corr = -128 * sum.
inline int32_t act32_sum(const Act32& a, int h) { return -a.corr[8 * h] / 128; }

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

void rows_scalar(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// The row-tile loop shared by the SIMD paths (a macro because each instruction set's copy must be
// compiled under that set's target options). Output rows go in groups of 16, and each tile of MAX
// activation rows (full tiles, then one smaller) passes over the whole group, whose weight rows stay in
// cache for the next tile: the activations of many rows (a prompt) are then read once per group
// rather than once per output row. Every activation row goes through the same instructions whichever
// tile it lands in.
#define SPECWISE_ROW_TILES(MAX)                                                                          \
  template <class K, int M>                                                                              \
  inline void tail(int rem, const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, float* out) { \
    if constexpr (M > 0) {                                                                               \
      if (rem == M) K::template tile<M>(w, nb, act, stride, out);                                        \
      else tail<K, M - 1>(rem, w, nb, act, stride, out);                                                 \
    }                                                                                                    \
  }                                                                                                      \
  template <class K>                                                                                     \
  void run(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,  \
           int64_t stride, int64_t nrows, float* y, int64_t ldy) {                                       \
    float tmp[MAX];                                                                                      \
    constexpr int64_t kGroup = 16;                                                                       \
    for (int64_t g0 = o0; g0 < o1; g0 += kGroup) {                                                       \
      for (int64_t r = 0; r < nrows; r += MAX) {                                                         \
        const int mb = static_cast<int>(std::min<int64_t>(MAX, nrows - r));                              \
        for (int64_t o = g0; o < std::min(o1, g0 + kGroup); ++o) {                                       \
          const uint8_t* wr = w + o * row_bytes;                                                         \
          if (mb == MAX) K::template tile<MAX>(wr, nb, act + r * stride, stride, tmp);                   \
          else tail<K, MAX - 1>(mb, wr, nb, act + r * stride, stride, tmp);                              \
          for (int i = 0; i < mb; ++i) y[(r + i) * ldy + o] = tmp[i];                                    \
        }                                                                                                \
      }                                                                                                  \
    }                                                                                                    \
  }

// ---------------------------------------------------------------------------------------------
// AVX2 path: 256-bit registers, up to 8 rows per weight block.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {

inline float hsum(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float hsum(__m256 v) { return hsum(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1))); }

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Bit `From` of every byte moved to bit `To`, the other bits cleared. 16-bit shifts suffice: the bit kept in
// each byte comes from the same byte.
template <int From, int To>
inline __m256i move_bit(__m256i v) {
  __m256i moved = v;
  if constexpr (From > To) moved = _mm256_srli_epi16(v, From - To);
  else if constexpr (From < To) moved = _mm256_slli_epi16(v, To - From);
  return _mm256_and_si256(moved, _mm256_set1_epi8(static_cast<char>(1 << To)));
}

// The 16-value sub-block scales of Q6_K (int8) and Q3_K (decoded as q3k_scales does) as 16 words.
template <int64_t Type>
inline __m256i k16_scales(const uint8_t* blk) {
  if constexpr (Type == kQ6_K) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
  } else {
    // Low four bits: scale j < 8 in the low nibble of byte j, scale j + 8 in its high nibble. High two bits:
    // bits 2k, 2k + 1 of byte 8 + i for scale 4k + i, shifted per dword k (the two bits kept stay in their byte).
    const uint8_t* s = blk + 96;
    const __m128i m4 = _mm_set1_epi8(0x0F), low8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s));
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(low8, m4), _mm_and_si128(_mm_srli_epi16(low8, 4), m4));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(load_u32(s + 8))),
                                                    _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(0x03));
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32)));
  }
}

// 8 int32 lanes folded to 4 (exact), so the float work per row runs on 128-bit registers.
inline __m128i fold4(__m256i v) { return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)); }

// The same float operations as ScalarQuant::block, eight values at a time.
struct Quant {
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

// Transposing reductions of several rows' int32 partial sums, per 128-bit lane (exact). Rows a, b:
// (a0 + a2, b0 + b2, a1 + a3, b1 + b3).
inline __m256i sum_pair(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
// Two pair sums (rows a, b and c, d): (a, b, c, d), each the sum of its row's four dwords.
inline __m256i sum_quad(__m256i ab, __m256i cd) {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
}
// A row without a partner: its sum in dwords 0 + 2, where sum_quad takes row a's. A pair sum without a
// partner: rows a, b in dwords 0, 1, where sum_quad leaves them.
inline __m256i sum_one(__m256i a) { return _mm256_add_epi32(a, _mm256_shuffle_epi32(a, 0xB1)); }
inline __m256i sum_two(__m256i ab) { return _mm256_add_epi32(ab, _mm256_shuffle_epi32(ab, 0x4E)); }

// Rows R, R + 1 of a tile of MB rows (v(m): row m's eight partial sums), then rows R to R + 3.
template <int MB, int R, class V>
inline __m256i pair_of(const V& v) {
  if constexpr (R + 1 < MB) return sum_pair(v(R), v(R + 1));
  else return sum_one(v(R));
}

template <int MB, int R, class V>
inline __m256i quad_of(const V& v) {
  if constexpr (R + 2 < MB) return sum_quad(pair_of<MB, R>(v), pair_of<MB, R + 2>(v));
  else return sum_two(pair_of<MB, R>(v));
}

// Row r's block sum in dword r: a 128-bit vector for MB <= 4, else 256-bit (lanes of missing rows: junk).
template <int MB, class V>
inline auto row_sums(const V& v) {
  if constexpr (MB <= 4) {
    return fold4(quad_of<MB, 0>(v));
  } else {  // (rows 0-3 | rows 4-7) from each half's two 128-bit lanes
    const __m256i x = quad_of<MB, 0>(v), y = quad_of<MB, 4>(v);
    return _mm256_add_epi32(_mm256_blend_epi32(x, y, 0xF0), _mm256_permute2x128_si256(x, y, 0x21));
  }
}

// The K-quants unpack a weight block once into registers and take every row of the tile against it. Per
// row, the products of a sub-block come out of vpmaddubsw as words (pairs of products); vphaddw adds
// neighbouring words of two registers, so that one vpmaddwd applies the sub-block scales to twice (Q6_K)
// or four times (Q4_K) as many values. An extra row's cost is its instructions (docs/BENCHMARKS.md: on a
// Zen 2 this made T(5) 15 % cheaper; pair sums by shifts and blends instead were slower). All sums stay
// exact (the bounds are given at each step), so a row's result is the same integer arithmetic as before.
//
// A row's block sum comes out as eight int32 partial sums. Rather than fold, convert and scale them row by
// row (eight instructions a row and block), the tile reduces its rows together (row_sums: unpacks and adds
// shared by the rows; exact, as every partial sum adds some of the block's terms, whose magnitudes total less
// than 2^29) into one vector whose lane r is row r's block sum, and the float work runs once per block on
// that vector, lanes = rows. Q4_K's mins sums come out likewise, lanes = rows: in tiles of one or two rows
// reduced along with the scale sums (a row's mins partial sums in the upper 128-bit lane), in larger tiles
// from the rows' block sums gathered once per call in lane order (the side data, with the activation scales).
// Per block, lane r does acc += float(isum) * (d * ad); Q4_K also macc += float(msum) * (-dmin * ad) in a
// lane of its own (lane r + 4 of the same vector in tiles of up to four rows, lane r of a second one in
// larger tiles), and out = acc + macc at the end. So a row sees the same float operations in every tile, of
// one row or eight (a one-row tile reaches the same integer sums within its own registers; lanes of missing
// rows are ignored). On a Zen 2 this made T(5) a sixth and T(8) a quarter cheaper, and moved T(1) within the
// noise (its one row pays four more integer instructions a block); vphaddd for the reduction was a few per
// cent slower than unpacks.
// Side data: in tiles of up to four rows the scales twice (lanes 4-7 scale the mins); the word pairs serve
// the mins sums of tiles of more than two rows.
// Q5_K is Q4_K with a fifth bit per value (bit j of byte l of its qh: value 32j + l) and the same scales:
// the same tile, its unsigned values up to 31 (the word bounds below double and still hold).
template <int64_t Type>
struct Q4KT : TileSide<8, true, true> {
  // The mins sums of the side data's rows (dwords = rows): pairs[j] times dword j of mins, over j < 4.
  static __m128i mins_sums(const __m128i* pairs, __m128i mins) {  // rows 0-3 (pairs[2j])
    const __m128i a = _mm_add_epi32(_mm_madd_epi16(_mm_load_si128(pairs), _mm_shuffle_epi32(mins, 0x00)),
                                    _mm_madd_epi16(_mm_load_si128(pairs + 2), _mm_shuffle_epi32(mins, 0x55)));
    const __m128i b = _mm_add_epi32(_mm_madd_epi16(_mm_load_si128(pairs + 4), _mm_shuffle_epi32(mins, 0xAA)),
                                    _mm_madd_epi16(_mm_load_si128(pairs + 6), _mm_shuffle_epi32(mins, 0xFF)));
    return _mm_add_epi32(a, b);
  }
  static __m256i mins_sums(const __m256i* pairs, __m256i mins) {  // rows 0-7
    const __m256i a = _mm256_add_epi32(_mm256_madd_epi16(load(pairs), _mm256_shuffle_epi32(mins, 0x00)),
                                       _mm256_madd_epi16(load(pairs + 1), _mm256_shuffle_epi32(mins, 0x55)));
    const __m256i b = _mm256_add_epi32(_mm256_madd_epi16(load(pairs + 2), _mm256_shuffle_epi32(mins, 0xAA)),
                                       _mm256_madd_epi16(load(pairs + 3), _mm256_shuffle_epi32(mins, 0xFF)));
    return _mm256_add_epi32(a, b);
  }

  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, const uint8_t* side,
                   float* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * block_bytes(Type);
      const float d = half(blk), dmin = half(blk + 2);
      alignas(16) uint8_t sc[8], mn[8];
      q4k_scales(blk + 4, sc, mn);
      // Word pairs (m[2j], m[2j + 1]) in dword j (|mins sum| <= 8 * 63 * 32 * 127 = 2048256).
      const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn)));
      // Word scales (s0, s0, s1, s1, s2, s2, s3, s3) and (s4, ..., s7) in both 128-bit lanes.
      const __m128i sc16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
      const __m256i s03 = _mm256_broadcastsi128_si256(_mm_unpacklo_epi16(sc16, sc16));
      const __m256i s47 = _mm256_broadcastsi128_si256(_mm_unpackhi_epi16(sc16, sc16));
      // Group g's 32 bytes: sub-block 2g in the low nibbles, 2g+1 in the high.
      __m256i wv[8];
      for (int g = 0; g < 4; ++g) {
        const __m256i raw = load(blk + (Type == kQ4_K ? 16 : 48) + 32 * g);
        wv[2 * g] = _mm256_and_si256(raw, m4);
        wv[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      }
      if constexpr (Type == kQ5_K) {  // |word| bounds: 4 products <= 15748, 8 products <= 31496
        const __m256i qh = load(blk + 16);
        wv[0] = _mm256_or_si256(wv[0], move_bit<0, 4>(qh));
        wv[1] = _mm256_or_si256(wv[1], move_bit<1, 4>(qh));
        wv[2] = _mm256_or_si256(wv[2], move_bit<2, 4>(qh));
        wv[3] = _mm256_or_si256(wv[3], move_bit<3, 4>(qh));
        wv[4] = _mm256_or_si256(wv[4], move_bit<4, 4>(qh));
        wv[5] = _mm256_or_si256(wv[5], move_bit<5, 4>(qh));
        wv[6] = _mm256_or_si256(wv[6], move_bit<6, 4>(qh));
        wv[7] = _mm256_or_si256(wv[7], move_bit<7, 4>(qh));
      }
      const auto isum = [&](int m) {
        const int8_t* q = (reinterpret_cast<const ActK*>(act + m * stride) + b)->q;
        // h[g], per 128-bit lane: four words of sub-block 2g, then four of 2g+1 (4 products each, |w| <= 7620).
        __m256i h[4];
        for (int g = 0; g < 4; ++g)
          h[g] = _mm256_hadd_epi16(_mm256_maddubs_epi16(wv[2 * g], load(q + 64 * g)),
                                   _mm256_maddubs_epi16(wv[2 * g + 1], load(q + 64 * g + 32)));
        // Again: words (s0, s0, s1, s1, s2, s2, s3, s3) per lane (8 products each, |w| <= 15240).
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_hadd_epi16(h[0], h[1]), s03),
                                _mm256_madd_epi16(_mm256_hadd_epi16(h[2], h[3]), s47));
      };
      const __m256 dd = _mm256_insertf128_ps(_mm256_set1_ps(d), _mm_set1_ps(-dmin), 1);
      if constexpr (MB <= 2) {  // acc: (scale terms of rows 0-1 | their mins terms), rows reduced together
        // Row m's four partial scale sums, then its four partial mins sums.
        const auto both = [&](int m) {
          const ActK* a = reinterpret_cast<const ActK*>(act + m * stride) + b;
          const __m128i ms = _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a->bsum32)));
          return _mm256_inserti128_si256(_mm256_castsi128_si256(fold4(isum(m))), ms, 1);
        };
        const __m256 ad = MB == 1 ? _mm256_set1_ps((reinterpret_cast<const ActK*>(act) + b)->d)
                                  : _mm256_load_ps(reinterpret_cast<const float*>(side + b * kSide));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quad_of<MB, 0>(both)), _mm256_mul_ps(dd, ad), acc);
      } else if constexpr (MB <= 4) {  // the same, the mins sums from the side data
        const float* sd = reinterpret_cast<const float*>(side + b * kSide);
        const __m128i ms = mins_sums(reinterpret_cast<const __m128i*>(sd + 8), mins);
        const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(row_sums<MB>(isum)), ms, 1);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(both), _mm256_mul_ps(dd, _mm256_load_ps(sd)), acc);
      } else {
        const float* sd = reinterpret_cast<const float*>(side + b * kSide);
        const __m256i ms = mins_sums(reinterpret_cast<const __m256i*>(sd + 8), _mm256_broadcastsi128_si256(mins));
        const __m256 ad = _mm256_load_ps(sd);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row_sums<MB>(isum)), _mm256_mul_ps(_mm256_set1_ps(d), ad), acc);
        macc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(_mm256_set1_ps(-dmin), ad), macc);
      }
    }
    alignas(32) float t[8];
    if constexpr (MB <= 4) _mm_store_ps(t, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
    else _mm256_store_ps(t, _mm256_add_ps(acc, macc));
    for (int m = 0; m < MB; ++m) out[m] = t[m];
  }
};

// Q3_K is Q6_K with 3-bit values (offset 4 instead of 32) and 6-bit scales packed otherwise: the same tile.
template <int64_t Type>
struct Q6KT : TileSide<8, false> {
  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, const uint8_t* side,
                   float* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    // pshufb controls: lane 0 takes words 0 and 2 four times each, lane 1 words 1 and 3 (then 4/6, 5/7).
    const __m256i pick0 = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 4, 5, 4, 5, 4, 5, 4, 5,
                                           2, 3, 2, 3, 2, 3, 2, 3, 6, 7, 6, 7, 6, 7, 6, 7);
    const __m256i pick1 = _mm256_add_epi8(pick0, _mm256_set1_epi8(8));
    __m128 acc4 = _mm_setzero_ps();  // tiles of up to four rows: lane r = row r
    __m256 acc8 = _mm256_setzero_ps();  // larger ones
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * block_bytes(Type);
      const float d = half(blk + (Type == kQ6_K ? 208 : 108));
      const __m256i sc16 = k16_scales<Type>(blk);
      const __m256i neg32 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, Type == kQ6_K ? 5 : 2));
      // q[k]: values 32k..32k+31, its low 128-bit lane sub-block 2k, its high lane 2k+1.
      __m256i q[8];
      if constexpr (Type == kQ3_K) {  // two bits from qs (byte 32 + 32h + l, bits 2s..2s+1), the third from hmask
        const __m256i m3 = _mm256_set1_epi8(0x03), hm = load(blk);
        const __m256i hb[8] = {move_bit<0, 2>(hm), move_bit<1, 2>(hm), move_bit<2, 2>(hm), move_bit<3, 2>(hm),
                               move_bit<4, 2>(hm), move_bit<5, 2>(hm), move_bit<6, 2>(hm), move_bit<7, 2>(hm)};
        for (int h = 0; h < 2; ++h) {
          const __m256i qs = load(blk + 32 + 32 * h);
          q[4 * h] = _mm256_or_si256(_mm256_and_si256(qs, m3), hb[4 * h]);
          q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2), m3), hb[4 * h + 1]);
          q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), m3), hb[4 * h + 2]);
          q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 6), m3), hb[4 * h + 3]);
        }
      } else {
        for (int h = 0; h < 2; ++h) {
          const __m256i qh = load(blk + 128 + 32 * h);
          const __m256i l0 = load(blk + 64 * h), l1 = load(blk + 64 * h + 32);
          const __m256i hb[4] = {_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 2), qh, _mm256_srli_epi16(qh, 2)};
          for (int s = 0; s < 4; ++s) {
            const __m256i src = (s & 1) ? l1 : l0;
            const __m256i nib = _mm256_and_si256(s >= 2 ? _mm256_srli_epi16(src, 4) : src, m4);
            q[4 * h + s] = _mm256_or_si256(nib, _mm256_and_si256(hb[s], m30));
          }
        }
      }
      // Word scales of pair p (registers 2p, 2p+1): lane 0 (s[4p] x4, s[4p+2] x4), lane 1 (s[4p+1] x4, s[4p+3] x4).
      const __m256i lo8 = _mm256_permute2x128_si256(sc16, sc16, 0x00), hi8 = _mm256_permute2x128_si256(sc16, sc16, 0x11);
      const __m256i sp[4] = {_mm256_shuffle_epi8(lo8, pick0), _mm256_shuffle_epi8(lo8, pick1),
                             _mm256_shuffle_epi8(hi8, pick0), _mm256_shuffle_epi8(hi8, pick1)};
      const auto isum = [&](int m) {
        const ActK* a = reinterpret_cast<const ActK*>(act + m * stride) + b;
        // The offset of 32 (Q3_K: 4): -32 * scale * (block sum of x) per 16 values.
        __m256i s = _mm256_madd_epi16(neg32, load(a->bsum16));
        for (int p = 0; p < 4; ++p) {  // words of 4 products, |w| <= 4 * 63 * 127 = 32004
          const __m256i hp = _mm256_hadd_epi16(_mm256_maddubs_epi16(q[2 * p], load(a->q + 64 * p)),
                                               _mm256_maddubs_epi16(q[2 * p + 1], load(a->q + 64 * p + 32)));
          s = _mm256_add_epi32(s, _mm256_madd_epi16(hp, sp[p]));
        }
        return s;
      };
      if constexpr (MB == 1) {
        const __m128 ad = _mm_set1_ps((reinterpret_cast<const ActK*>(act) + b)->d);
        acc4 = _mm_fmadd_ps(_mm_cvtepi32_ps(row_sums<1>(isum)), _mm_mul_ps(_mm_set1_ps(d), ad), acc4);
      } else if constexpr (MB <= 4) {
        const __m128 ad = _mm_load_ps(reinterpret_cast<const float*>(side + b * kSide));
        acc4 = _mm_fmadd_ps(_mm_cvtepi32_ps(row_sums<MB>(isum)), _mm_mul_ps(_mm_set1_ps(d), ad), acc4);
      } else {
        const __m256 ad = _mm256_load_ps(reinterpret_cast<const float*>(side + b * kSide));
        acc8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row_sums<MB>(isum)), _mm256_mul_ps(_mm256_set1_ps(d), ad), acc8);
      }
    }
    alignas(32) float t[8];
    if constexpr (MB <= 4) _mm_store_ps(t, acc4);
    else _mm256_store_ps(t, acc8);
    for (int m = 0; m < MB; ++m) out[m] = t[m];
  }
};

using Q4K = Q4KT<kQ4_K>;
using Q5K = Q4KT<kQ5_K>;
using Q6K = Q6KT<kQ6_K>;
using Q3K = Q6KT<kQ3_K>;

// Q2_K: the scale sums as in Q6K's tile (2-bit values, 4-bit scales, no offset), and the 4-bit mins times
// the activations' sums per 16 values, which dmin scales. Each row's two sums are folded to four dwords
// each and reduced together, scale sums in the low 128-bit lane and mins sums in the high (as Q4K's tiles
// of up to two rows do), so that the float work runs once per block for the tile, lanes = rows.
struct Q2K : TileSide<8, false, true> {
  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, const uint8_t* side,
                   float* out) {
    const __m256i m3 = _mm256_set1_epi8(0x03), low4 = _mm256_set1_epi16(0x0F);
    // As Q6K's: lane 0 takes words 0 and 2 four times each, lane 1 words 1 and 3 (then 4/6, 5/7).
    const __m256i pick0 = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 4, 5, 4, 5, 4, 5, 4, 5,
                                           2, 3, 2, 3, 2, 3, 2, 3, 6, 7, 6, 7, 6, 7, 6, 7);
    const __m256i pick1 = _mm256_add_epi8(pick0, _mm256_set1_epi8(8));
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * 84;
      const float d = half(blk + 80), dmin = half(blk + 82);
      const __m256i packed = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
      const __m256i sc16 = _mm256_and_si256(packed, low4), mn16 = _mm256_srli_epi16(packed, 4);
      __m256i q[8];  // values 32k..32k+31, as Q6K's
      for (int h = 0; h < 2; ++h) {
        const __m256i qs = load(blk + 16 + 32 * h);
        q[4 * h] = _mm256_and_si256(qs, m3);
        q[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(qs, 2), m3);
        q[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m3);
        q[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(qs, 6), m3);
      }
      const __m256i lo8 = _mm256_permute2x128_si256(sc16, sc16, 0x00), hi8 = _mm256_permute2x128_si256(sc16, sc16, 0x11);
      const __m256i sp[4] = {_mm256_shuffle_epi8(lo8, pick0), _mm256_shuffle_epi8(lo8, pick1),
                             _mm256_shuffle_epi8(hi8, pick0), _mm256_shuffle_epi8(hi8, pick1)};
      // Row m's four partial scale sums, then its four partial mins sums.
      const auto both = [&](int m) {
        const ActK* a = reinterpret_cast<const ActK*>(act + m * stride) + b;
        __m256i s = _mm256_setzero_si256();
        for (int p = 0; p < 4; ++p) {  // words of 4 products, |w| <= 4 * 3 * 127 = 1524
          const __m256i hp = _mm256_hadd_epi16(_mm256_maddubs_epi16(q[2 * p], load(a->q + 64 * p)),
                                               _mm256_maddubs_epi16(q[2 * p + 1], load(a->q + 64 * p + 32)));
          s = _mm256_add_epi32(s, _mm256_madd_epi16(hp, sp[p]));
        }
        const __m256i ms = _mm256_madd_epi16(mn16, load(a->bsum16));
        return _mm256_inserti128_si256(_mm256_castsi128_si256(fold4(s)), fold4(ms), 1);
      };
      if constexpr (MB <= 4) {
        const __m256 dd = _mm256_insertf128_ps(_mm256_set1_ps(d), _mm_set1_ps(-dmin), 1);
        const __m256 ad = MB == 1 ? _mm256_set1_ps((reinterpret_cast<const ActK*>(act) + b)->d)
                                  : _mm256_load_ps(reinterpret_cast<const float*>(side + b * kSide));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quad_of<MB, 0>(both)), _mm256_mul_ps(dd, ad), acc);
      } else {  // (scale sums | mins sums) of rows 0-3 and of rows 4-7, regrouped by kind
        const __m256i x = quad_of<MB, 0>(both), y = quad_of<MB, 4>(both);
        const __m256 ad = _mm256_load_ps(reinterpret_cast<const float*>(side + b * kSide));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_permute2x128_si256(x, y, 0x20)),
                              _mm256_mul_ps(_mm256_set1_ps(d), ad), acc);
        macc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_permute2x128_si256(x, y, 0x31)),
                               _mm256_mul_ps(_mm256_set1_ps(-dmin), ad), macc);
      }
    }
    alignas(32) float t[8];
    if constexpr (MB <= 4) _mm_store_ps(t, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
    else _mm256_store_ps(t, _mm256_add_ps(acc, macc));
    for (int m = 0; m < MB; ++m) out[m] = t[m];
  }
};

// IQ4_XS: the 4-bit codes looked up in kIQ4Values (vpshufb) give signed values, whose signs move to the
// activations as in Blocks32 (words of two products, |w| <= 2 * 127 * 127 = 32258: too large to add
// further), and one vpmaddwd per 32-value sub-block applies its scale (|row sum| <= 8 * 32 * 127 * 127 * 32
// < 2^31). Row sums and float work as in Q6K's tile.
struct IQ4XS : TileSide<8, false> {
  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, const uint8_t* side,
                   float* out) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
    __m128 acc4 = _mm_setzero_ps();
    __m256 acc8 = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * 136;
      const float d = half(blk);
      int8_t sc[8];
      iq4xs_scales(blk, sc);
      __m256i v[8], av[8];  // sub-block j: values 32j..32j+15 in the low 128-bit lane, the rest in the high
      for (int j = 0; j < 8; ++j) {
        const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 8 + 16 * j));
        v[j] = _mm256_shuffle_epi8(table, _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4)));
        av[j] = _mm256_abs_epi8(v[j]);
      }
      const auto isum = [&](int m) {
        const int8_t* q = (reinterpret_cast<const ActK*>(act + m * stride) + b)->q;
        __m256i s = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j)
          s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(av[j], _mm256_sign_epi8(load(q + 32 * j), v[j])),
                                                    _mm256_set1_epi16(sc[j])));
        return s;
      };
      if constexpr (MB == 1) {
        const __m128 ad = _mm_set1_ps((reinterpret_cast<const ActK*>(act) + b)->d);
        acc4 = _mm_fmadd_ps(_mm_cvtepi32_ps(row_sums<1>(isum)), _mm_mul_ps(_mm_set1_ps(d), ad), acc4);
      } else if constexpr (MB <= 4) {
        const __m128 ad = _mm_load_ps(reinterpret_cast<const float*>(side + b * kSide));
        acc4 = _mm_fmadd_ps(_mm_cvtepi32_ps(row_sums<MB>(isum)), _mm_mul_ps(_mm_set1_ps(d), ad), acc4);
      } else {
        const __m256 ad = _mm256_load_ps(reinterpret_cast<const float*>(side + b * kSide));
        acc8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row_sums<MB>(isum)), _mm256_mul_ps(_mm256_set1_ps(d), ad), acc8);
      }
    }
    alignas(32) float t[8];
    if constexpr (MB <= 4) _mm_store_ps(t, acc4);
    else _mm256_store_ps(t, acc8);
    for (int m = 0; m < MB; ++m) out[m] = t[m];
  }
};

// The K-quants' loop: as SPECWISE_ROW_TILES (output rows in groups, every tile of up to kTile activation
// rows over each group), with each tile's side data gathered once per call.
constexpr int kTile = 8;

template <class K, int M = kTile>
inline void k_tile(int rows, const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, const uint8_t* side,
                   float* out) {
  if constexpr (M > 0) {
    if (rows == M) K::template tile<M>(w, nb, act, stride, side, out);
    else k_tile<K, M - 1>(rows, w, nb, act, stride, side, out);
  }
}

template <class K>
void run_k(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
           int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  constexpr int64_t kGroup = 16;
  const int64_t tiles = (nrows + kTile - 1) / kTile;
  std::vector<uint8_t> side_store(nrows > 1 ? static_cast<size_t>(tiles * nb * K::kSide + 32) : 0);
  uint8_t* side = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(side_store.data()) + 31) & ~uintptr_t{31});
  auto rows_of = [&](int64_t t) { return static_cast<int>(std::min<int64_t>(kTile, nrows - t * kTile)); };
  for (int64_t t = 0; t < tiles; ++t)
    if (rows_of(t) > 1) K::prepare(act + t * kTile * stride, stride, rows_of(t), nb, side + t * nb * K::kSide);
  float out[kTile];
  for (int64_t g0 = o0; g0 < o1; g0 += kGroup)
    for (int64_t t = 0; t < tiles; ++t) {
      const int mb = rows_of(t);
      for (int64_t o = g0; o < std::min(o1, g0 + kGroup); ++o) {
        k_tile<K>(mb, w + o * row_bytes, nb, act + t * kTile * stride, stride, side + t * nb * K::kSide, out);
        for (int i = 0; i < mb; ++i) y[(t * kTile + i) * ldy + o] = out[i];
      }
    }
}

// A 32-value block's 4-bit codes (16 bytes: value j in the low nibble of byte j, value j + 16 in its high).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}

// Q5_0's and Q5_1's fifth bits (a 32-bit word, bit i for value i) as 0x10 in byte i.
inline __m256i fifth_bits(const uint8_t* qh) {
  // Spread the 32 high bits over 32 bytes: byte i tests bit i.
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_u32(qh))),
                                            _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                              0x0101010101010101LL, 0x0000000000000000LL));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10));
}

template <int64_t Type>
struct Blocks32 {
  // The 32 signed weights of one Q4_0 / Q5_0 / Q8_0 / IQ4_NL block.
  static __m256i values(const uint8_t* blk) {
    if constexpr (Type == kQ8_0) {
      return load(blk + 2);
    } else if constexpr (Type == kQ4_0) {
      return _mm256_sub_epi8(nibbles(blk + 2), _mm256_set1_epi8(8));
    } else if constexpr (Type == kIQ4_NL) {
      const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
      return _mm256_shuffle_epi8(table, nibbles(blk + 2));
    } else {
      return _mm256_sub_epi8(_mm256_or_si256(nibbles(blk + 6), fifth_bits(blk + 2)), _mm256_set1_epi8(16));
    }
  }

  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    constexpr int64_t bs = block_bytes(Type);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * bs;
      const float d = half(blk);
      const __m256i v = values(blk);
      const __m256i av = _mm256_abs_epi8(v);  // |v| <= 128 as unsigned; the sign moves to the activation
      const int h = static_cast<int>(b & 1);
      for (int m = 0; m < MB; ++m) {
        const Act32* a = reinterpret_cast<const Act32*>(act + m * stride) + b / 2;
        const __m256i p = _mm256_maddubs_epi16(av, _mm256_sign_epi8(load(a->q + 32 * h), v));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), _mm256_set1_ps(d * a->d[8 * h]), acc[m]);
      }
    }
    for (int m = 0; m < MB; ++m) out[m] = hsum(acc[m]);
  }
};

// Q4_1 / Q5_1: unsigned values (up to 31, so vpmaddubsw needs no sign trick), and the min times the block's
// sum of activation codes (from Act32's corr), one float term per row and block.
template <int64_t Type>
struct Blocks32Min {
  static __m256i values(const uint8_t* blk) {
    if constexpr (Type == kQ4_1) return nibbles(blk + 4);
    else return _mm256_or_si256(nibbles(blk + 8), fifth_bits(blk + 4));
  }

  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    constexpr int64_t bs = block_bytes(Type);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MB];
    float macc[MB];
    for (int m = 0; m < MB; ++m) {
      acc[m] = _mm256_setzero_ps();
      macc[m] = 0.f;
    }
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * bs;
      const float d = half(blk), mn = half(blk + 2);
      const __m256i u = values(blk);
      const int h = static_cast<int>(b & 1);
      for (int m = 0; m < MB; ++m) {
        const Act32* a = reinterpret_cast<const Act32*>(act + m * stride) + b / 2;
        const __m256i p = _mm256_maddubs_epi16(u, load(a->q + 32 * h));  // |w| <= 2 * 31 * 127
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), _mm256_set1_ps(d * a->d[8 * h]), acc[m]);
        macc[m] += (mn * a->d[8 * h]) * static_cast<float>(act32_sum(*a, h));
      }
    }
    for (int m = 0; m < MB; ++m) out[m] = hsum(acc[m]) + macc[m];
  }
};

SPECWISE_ROW_TILES(8)

void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
          int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (type) {
    case kQ4_K: run_k<Q4K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ6_K: run_k<Q6K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_0: run<Blocks32<kQ5_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ8_0: run<Blocks32<kQ8_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_K: run_k<Q5K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ3_K: run_k<Q3K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ2_K: run_k<Q2K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kIQ4_XS: run_k<IQ4XS>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ4_0: run<Blocks32<kQ4_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kIQ4_NL: run<Blocks32<kIQ4_NL>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ4_1: run<Blocks32Min<kQ4_1>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_1: run<Blocks32Min<kQ5_1>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
  }
}

}  // namespace avx2
#pragma GCC pop_options

// ---------------------------------------------------------------------------------------------
// AVX-512 path (F, BW, VL, VNNI): 512-bit registers, up to 8 rows per weight block.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
namespace avx512 {

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m512i load(const void* p) { return _mm512_loadu_si512(p); }

template <class A>
inline const A* row(const uint8_t* act, int m, int64_t stride, int64_t block) {
  return reinterpret_cast<const A*>(act + m * stride) + block;
}

// 16 int32 lanes folded to 4 (exact).
inline __m128i fold4(__m512i v) {
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

inline __m512i broadcast256(const uint8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

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
};

// vpermw indices: word i takes word Mul * (i / 8) + Add, plus Half in the upper four words of each
// 128-bit lane.
template <int Mul, int Add, int Half>
struct LaneIndex {
  static constexpr int16_t at(int i) { return static_cast<int16_t>(Mul * (i / 8) + Add + (i % 8 >= 4 ? Half : 0)); }
  alignas(64) static constexpr int16_t lanes[32] = {
      at(0),  at(1),  at(2),  at(3),  at(4),  at(5),  at(6),  at(7),  at(8),  at(9),  at(10),
      at(11), at(12), at(13), at(14), at(15), at(16), at(17), at(18), at(19), at(20), at(21),
      at(22), at(23), at(24), at(25), at(26), at(27), at(28), at(29), at(30), at(31)};
  static __m512i get() { return _mm512_load_si512(lanes); }
};

// 16-bit lanes: `lo` in the lower 256 bits, `hi` in the upper.
inline __m512i halves_epi16(short lo, short hi) {
  return _mm512_inserti64x4(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi), 1);
}

// ---------------------------------------------------------------------------------------------
// The K-quants (Q4_K, Q6_K) take tiles of up to 16 activation rows per unpacked weight block. Per block,
// each row's integer sum must be reduced to one number before the float scales apply, and done row by
// row that reduction and the float work cost as much as the dot products themselves. So:
//  - two rows share each accumulator: their vpdpbusd sums (|sum| < 2^15) are packed to words by
//    vpackssdw, row a in the low and row b in the high 64 bits of every 128-bit lane, and one vpdpwssd
//    applies the weight's sub-block scales to both;
//  - Lanes::reduce then sums each row's lanes with shuffles shared by the rows of the tile, leaving row
//    r's block sum in lane r of one vector;
//  - the float work runs once per tile and block on that vector (lanes = rows), as exactly the scalar
//    path's operations, so every row's result is bit-identical to the scalar path's whatever its tile.
// A one-row tile computes the same integer sums and float operations without the lanes. The activation
// scales and block sums that the float work needs are gathered once per call in lane order (the side data).
constexpr int kTile = 16;

// The weight bytes kAhead past a block of Bytes (the same row's later blocks, then the next rows') into L1:
// with the hardware prefetcher alone the loads wait on memory, for every tile size. On a Zen 4, the target's
// linear layers: T(2) 0.83-0.86x with it than without, T(1) unchanged; prefetching into L2 instead
// (T1 / T2 hints) made T(1) 13 % and T(2) 24-26 % slower, and other distances (576-9216) moved T(1) by 3 %
// or less.
constexpr int64_t kAhead = 1152;
template <int Bytes>
inline void prefetch(const uint8_t* blk) {
  for (int i = 0; i < Bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(blk) + kAhead + i, _MM_HINT_T0);
}

// 128-bit lanes (a0 + a1, a2 + a3, b0 + b1, b2 + b3).
inline __m512i fold_lanes(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x88), _mm512_shuffle_i64x2(a, b, 0xdd));
}

// Qword i of u (a row's two partial sums) to dword i.
inline __m256i qword_sums(__m512i u) { return _mm512_cvtepi64_epi32(_mm512_add_epi32(u, _mm512_srli_epi64(u, 32))); }

// v[j], j < NP: rows 2j and 2j + 1 in the low and high qword of every 128-bit lane. Returns the rows' sums
// over 16 lanes, row r in dword r of the 2 (NP <= 4) or 4 (NP <= 8) lower 128-bit lanes.
template <int NP>
inline __m512i reduce_pairs(const __m512i* v) {
  if constexpr (NP == 1) {  // (a0 + a1, a2 + a3 as x, b0 + b1, b2 + b3 as y) then (x, y)
    const __m128i h = fold4(v[0]);
    return _mm512_castsi128_si512(_mm_hadd_epi32(h, h));
  }
  const __m512i z = _mm512_setzero_si512();
  __m512i t[4];
  for (int i = 0; i < 4; ++i) t[i] = 2 * i < NP ? fold_lanes(v[2 * i], 2 * i + 1 < NP ? v[2 * i + 1] : z) : z;
  const __m256i lo = qword_sums(fold_lanes(t[0], t[1]));
  if constexpr (NP <= 4) return _mm512_castsi256_si512(lo);
  else return _mm512_inserti64x4(_mm512_castsi256_si512(lo), qword_sums(fold_lanes(t[2], t[3])), 1);
}

// Vectors of W lanes (4, 8 or 16: enough for the tile's rows) for the per-block float work.
template <int W>
struct Lanes;

template <>
struct Lanes<4> {
  using F = __m128;
  using I = __m128i;
  static F load(const uint8_t* p) { return _mm_load_ps(reinterpret_cast<const float*>(p)); }
  static I load_i(const uint8_t* p) { return _mm_load_si128(reinterpret_cast<const __m128i*>(p)); }
  static F set1(float f) { return _mm_set1_ps(f); }
  static F add(F a, F b) { return _mm_add_ps(a, b); }
  static F sub(F a, F b) { return _mm_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm_mul_ps(a, b); }
  static F cvt(I a) { return _mm_cvtepi32_ps(a); }
  static I zero() { return _mm_setzero_si128(); }
  static I dpwssd(I acc, I a, I b) { return _mm_dpwssd_epi32(acc, a, b); }
  static I dword(__m128i v, int j) { return _mm_castps_si128(_mm_permutevar_ps(_mm_castsi128_ps(v), _mm_set1_epi32(j))); }
  static I of(__m512i v) { return _mm512_castsi512_si128(v); }
  static void store(float* p, F v) { _mm_store_ps(p, v); }
};

template <>
struct Lanes<8> {
  using F = __m256;
  using I = __m256i;
  static F load(const uint8_t* p) { return _mm256_load_ps(reinterpret_cast<const float*>(p)); }
  static I load_i(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static F set1(float f) { return _mm256_set1_ps(f); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  static I zero() { return _mm256_setzero_si256(); }
  static I dpwssd(I acc, I a, I b) { return _mm256_dpwssd_epi32(acc, a, b); }
  static I dword(__m128i v, int j) { return _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(v), _mm256_set1_epi32(j)); }
  static I of(__m512i v) { return _mm512_castsi512_si256(v); }
  static void store(float* p, F v) { _mm256_store_ps(p, v); }
};

template <>
struct Lanes<16> {
  using F = __m512;
  using I = __m512i;
  static F load(const uint8_t* p) { return _mm512_load_ps(p); }
  static I load_i(const uint8_t* p) { return _mm512_load_si512(p); }
  static F set1(float f) { return _mm512_set1_ps(f); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  static I zero() { return _mm512_setzero_si512(); }
  static I dpwssd(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
  static I dword(__m128i v, int j) { return _mm512_permutexvar_epi32(_mm512_set1_epi32(j), _mm512_castsi128_si512(v)); }
  static I of(__m512i v) { return v; }
  static void store(float* p, F v) { _mm512_store_ps(p, v); }
};

template <int MB>
using LanesFor = Lanes<(MB <= 4 ? 4 : MB <= 8 ? 8 : 16)>;

// Q4_K: a block's 128 bytes of 4-bit values are four 32-byte groups, group k holding values 64k..64k+31
// in its low nibbles (sub-block 2k) and 64k+32..64k+63 in its high nibbles (sub-block 2k+1). Regrouped
// by 16-byte quarters, register W0 = the low nibbles of every group's first quarter, W1 = of every
// second quarter, W2 / W3 = the high nibbles: in all four, 128-bit lane k belongs to group k, so lane k
// of W0 and W1 is sub-block 2k, of W2 and W3 sub-block 2k+1 (eight products per dword, |sum| <= 8 * 15
// * 127 = 15240). The activations come in the matching order (ActK::qt).
struct Q4K : TileSide<16, true> {
  // One weight row of nb blocks against MB activation rows: out[0, MB) (64-byte aligned).
  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, const uint8_t* side,
                   float* out) {
    constexpr int NP = (MB + 1) / 2;
    using L = LanesFor<MB>;
    const __m512i m4 = _mm512_set1_epi8(0x0F), z = _mm512_setzero_si512();
    // Word scales per 128-bit lane k: 2k (pairs' low nibbles), 2k+1 (high), both (one row's packed halves).
    const __m512i even = LaneIndex<2, 0, 0>::get(), odd = LaneIndex<2, 1, 0>::get(), both = LaneIndex<2, 0, 1>::get();
    typename L::F vacc = L::set1(0.f);
    float sacc = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * 144;
      prefetch<144>(blk);
      const float d = half(blk), dmin = half(blk + 2);
      // The 6-bit scales and mins decoded in general registers, then moved over.
      uint64_t s8;
      std::memcpy(&s8, blk + 4, 8);
      const uint64_t c = load_u32(blk + 12);
      const uint64_t lo = s8 & 0x3f3f3f3f3f3f3f3fULL;  // scales 0-3, mins 0-3
      const uint64_t hi = (c & 0x0f0f0f0fULL) | ((c << 28) & 0x0f0f0f0f00000000ULL) | ((s8 >> 2) & 0x3030303030303030ULL);
      const __m128i scmn = _mm_unpacklo_epi32(_mm_cvtsi64_si128(static_cast<long long>(lo)),
                                              _mm_cvtsi64_si128(static_cast<long long>(hi)));
      // scmn bytes: scales 0-3, scales 4-7, mins 0-3, mins 4-7.
      const __m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(scmn));
      const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(scmn, scmn));
      const __m512i r0 = load(blk + 16), r1 = load(blk + 80);
      const __m512i first = _mm512_shuffle_i64x2(r0, r1, 0x88), second = _mm512_shuffle_i64x2(r0, r1, 0xdd);
      const __m512i w0 = _mm512_and_si512(first, m4), w1 = _mm512_and_si512(second, m4);
      const __m512i w2 = _mm512_and_si512(_mm512_srli_epi16(first, 4), m4);
      const __m512i w3 = _mm512_and_si512(_mm512_srli_epi16(second, 4), m4);
      auto low = [&](const int8_t* q) { return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, w0, load(q)), w1, load(q + 64)); };
      auto high = [&](const int8_t* q) { return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, w2, load(q + 128)), w3, load(q + 192)); };
      if constexpr (MB == 1) {
        const ActK* a = row<ActK>(act, 0, stride, b);
        const __m128i v = fold4(_mm512_dpwssd_epi32(z, _mm512_packs_epi32(low(a->qt), high(a->qt)),
                                                    _mm512_permutexvar_epi16(both, sc)));
        const __m128i ms = _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a->bsum32)));
        // Both sums at once: lanes (isum, isum, msum, msum), then (d, d, dmin, dmin) * ad * each.
        __m128i t = _mm_add_epi32(_mm_unpacklo_epi64(v, ms), _mm_unpackhi_epi64(v, ms));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk))));
        const __m128 prod = _mm_mul_ps(_mm_mul_ps(_mm_unpacklo_ps(dd, dd), _mm_set1_ps(a->d)), _mm_cvtepi32_ps(t));
        sacc += _mm_cvtss_f32(prod);
        sacc -= _mm_cvtss_f32(_mm_movehl_ps(prod, prod));
      } else {
        const __m512i s_even = _mm512_permutexvar_epi16(even, sc), s_odd = _mm512_permutexvar_epi16(odd, sc);
        __m512i v[NP];
        for (int j = 0; j < NP; ++j) {
          const int8_t* qa = row<ActK>(act, 2 * j, stride, b)->qt;
          const int8_t* qb = 2 * j + 1 < MB ? row<ActK>(act, 2 * j + 1, stride, b)->qt : nullptr;
          v[j] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(z, _mm512_packs_epi32(low(qa), qb ? low(qb) : z), s_even),
                                     _mm512_packs_epi32(high(qa), qb ? high(qb) : z), s_odd);
        }
        const uint8_t* sd = side + b * kSide;
        typename L::I msum = L::zero();
        for (int j = 0; j < 4; ++j) msum = L::dpwssd(msum, L::load_i(sd + 64 + 64 * j), L::dword(mins, j));
        const typename L::F ad = L::load(sd);
        vacc = L::add(vacc, L::mul(L::mul(L::set1(d), ad), L::cvt(L::of(reduce_pairs<NP>(v)))));
        vacc = L::sub(vacc, L::mul(L::mul(L::set1(dmin), ad), L::cvt(msum)));
      }
    }
    if constexpr (MB == 1) out[0] = sacc;
    else L::store(out, vacc);
  }
};

struct Q6K : TileSide<16, false> {
  // As Q4K::tile. q[k] holds values 64k..64k+63; one vpdpbusd dword is four products (|sum| <= 4 * 63 *
  // 127 = 32004) of the 16-value sub-block 4k + (its 128-bit lane).
  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, const uint8_t* side,
                   float* out) {
    constexpr int NP = (MB + 1) / 2;
    using L = LanesFor<MB>;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), z = _mm512_setzero_si512();
    const __m512i up = halves_epi16(4, 2), down = halves_epi16(0, 2);  // qh's 2-bit groups 0,1 / 2,3 to bits 4-5
    // Word scales of pack k of two rows (every word of 128-bit lane l: scale 4k + l), and of one row's
    // packs of q[0], q[1] and of q[2], q[3].
    const __m512i idx[4] = {LaneIndex<1, 0, 0>::get(), LaneIndex<1, 4, 0>::get(), LaneIndex<1, 8, 0>::get(),
                            LaneIndex<1, 12, 0>::get()};
    const __m512i idx1[2] = {LaneIndex<1, 0, 4>::get(), LaneIndex<1, 8, 4>::get()};
    // The offsets' qwords 0-3 of row a to the low halves of the 128-bit lanes, of row b to the high.
    const __m512i interleave = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
    typename L::F vacc = L::set1(0.f);
    float sacc = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * 210;
      prefetch<210>(blk);
      const float d = half(blk + 208);
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
      const __m256i neg32 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
      __m512i q[4];
      for (int h = 0; h < 2; ++h) {  // half h holds values 128h..128h+127
        const __m512i ql = load(blk + 64 * h);
        const __m512i qh = broadcast256(blk + 128 + 32 * h);
        q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, up), m30));
        q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                       _mm512_and_si512(_mm512_srlv_epi16(qh, down), m30));
      }
      // The offset of 32: -32 * scale * (sum of x) per 16 values, as the accumulators' start.
      auto offsets = [&](const ActK* a) {
        return _mm256_madd_epi16(neg32, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a->bsum16)));
      };
      if constexpr (MB == 1) {
        const ActK* a = row<ActK>(act, 0, stride, b);
        __m512i x[4];
        for (int k = 0; k < 4; ++k) x[k] = _mm512_dpbusd_epi32(z, q[k], load(a->q + 64 * k));
        __m512i sum = _mm512_castsi256_si512(offsets(a));
        for (int k = 0; k < 2; ++k)
          sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(x[2 * k], x[2 * k + 1]),
                                    _mm512_permutexvar_epi16(idx1[k], _mm512_castsi256_si512(sc16)));
        __m128i t = fold4(sum);
        t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
        t = _mm_add_epi32(t, _mm_srli_epi64(t, 32));
        sacc += (d * a->d) * static_cast<float>(_mm_cvtsi128_si32(t));
      } else {
        __m512i s[4];
        for (int k = 0; k < 4; ++k) s[k] = _mm512_permutexvar_epi16(idx[k], _mm512_castsi256_si512(sc16));
        __m512i v[NP];
        for (int j = 0; j < NP; ++j) {
          const ActK* a = row<ActK>(act, 2 * j, stride, b);
          const ActK* bb = 2 * j + 1 < MB ? row<ActK>(act, 2 * j + 1, stride, b) : nullptr;
          __m512i sum = _mm512_permutex2var_epi64(_mm512_castsi256_si512(offsets(a)), interleave,
                                                  _mm512_castsi256_si512(bb ? offsets(bb) : _mm256_setzero_si256()));
          for (int k = 0; k < 4; ++k) {
            const __m512i xa = _mm512_dpbusd_epi32(z, q[k], load(a->q + 64 * k));
            const __m512i xb = bb ? _mm512_dpbusd_epi32(z, q[k], load(bb->q + 64 * k)) : z;
            sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(xa, xb), s[k]);
          }
          v[j] = sum;
        }
        vacc = L::add(vacc, L::mul(L::mul(L::set1(d), L::load(side + b * kSide)), L::cvt(L::of(reduce_pairs<NP>(v)))));
      }
    }
    if constexpr (MB == 1) out[0] = sacc;
    else L::store(out, vacc);
  }
};

// Output rows [o0, o1) against one tile of MB activation rows: y[r * ldy + o].
template <class K, int MB>
void tile_rows(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
               int64_t stride, const uint8_t* side, float* y, int64_t ldy) {
  alignas(64) float acc[kTile];
  for (int64_t o = o0; o < o1; ++o) {
    K::template tile<MB>(w + o * row_bytes, nb, act, stride, side, acc);
    for (int r = 0; r < MB; ++r) y[r * ldy + o] = acc[r];
  }
}

template <class K, int M = kTile>
void tile_rows_n(int rows, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
                 int64_t stride, const uint8_t* side, float* y, int64_t ldy) {
  if constexpr (M > 0) {
    if (rows == M) tile_rows<K, M>(w, row_bytes, o0, o1, nb, act, stride, side, y, ldy);
    else tile_rows_n<K, M - 1>(rows, w, row_bytes, o0, o1, nb, act, stride, side, y, ldy);
  }
}

// The K-quants' loop: output rows in groups of kGroup, and for each group every tile of activation rows
// (while a tile passes over the group's weight rows, they stay in cache for the next tile).
template <class K>
void run_k(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
           int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  constexpr int64_t kGroup = 16;
  const int64_t tiles = (nrows + kTile - 1) / kTile;
  std::vector<uint8_t> side_store(static_cast<size_t>(tiles * nb * K::kSide + 64));
  uint8_t* side = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(side_store.data()) + 63) & ~uintptr_t{63});
  auto rows_of = [&](int64_t t) { return static_cast<int>(std::min<int64_t>(kTile, nrows - t * kTile)); };
  for (int64_t t = 0; t < tiles; ++t)
    if (rows_of(t) > 1) K::prepare(act + t * kTile * stride, stride, rows_of(t), nb, side + t * nb * K::kSide);
  for (int64_t g0 = o0; g0 < o1; g0 += kGroup)
    for (int64_t t = 0; t < tiles; ++t)
      tile_rows_n<K>(rows_of(t), w, row_bytes, g0, std::min(o1, g0 + kGroup), nb, act + t * kTile * stride, stride,
                     side + t * nb * K::kSide, y + t * kTile * ldy, ldy);
}

template <int64_t Type>
struct Blocks32 {
  // Two blocks' 64 weights as unsigned bytes (Q8_0: v + 128, Q5_0: v + 16); the activations' `corr`
  // undoes the offsets. A missing second block contributes zeros.
  static __m512i values(const uint8_t* a, const uint8_t* b) {
    if (Type == kQ8_0) {
      const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
      const __m256i lo = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2)), flip);
      const __m256i hi = b ? _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), flip)
                           : _mm256_setzero_si256();
      return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 6));
    const __m128i qb = b ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6)) : _mm_setzero_si128();
    const __m512i both = _mm512_castsi256_si512(_mm256_set_m128i(qb, qa));
    const __m512i spread = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0), both);  // qa qa qb qb
    const __m512i shift = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                           0x0004000400040004LL, 0x0004000400040004LL, 0, 0);
    const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(spread, shift), _mm512_set1_epi8(0x0F));
    const uint64_t bits = static_cast<uint64_t>(load_u32(a + 2)) | (b ? static_cast<uint64_t>(load_u32(b + 2)) << 32 : 0);
    return _mm512_or_si512(nib, _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(0x10)));
  }

  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    constexpr int64_t bs = Type == kQ8_0 ? 34 : 22;
    __m512 acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t p = 0; p < (nb + 1) / 2; ++p) {
      const uint8_t* b0 = w + 2 * p * bs;
      const uint8_t* b1 = 2 * p + 1 < nb ? b0 + bs : nullptr;
      const __m512i u = values(b0, b1);
      const __m512 ws = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(half(b0)), _mm512_set1_ps(b1 ? half(b1) : 0.f));
      for (int m = 0; m < MB; ++m) {
        const Act32* a = reinterpret_cast<const Act32*>(act + m * stride) + p;
        const __m512i isum = _mm512_dpbusd_epi32(load(a->corr), u, load(a->q));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(ws, _mm512_loadu_ps(a->d)), acc[m]);
      }
    }
    for (int m = 0; m < MB; ++m) out[m] = _mm512_reduce_add_ps(acc[m]);
  }
};

SPECWISE_ROW_TILES(8)

void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
          int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (type) {
    case kQ4_K: run_k<Q4K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ6_K: run_k<Q6K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_0: run<Blocks32<kQ5_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ8_0: run<Blocks32<kQ8_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    // The other types have no AVX-512 tiles yet: their AVX2 tiles run them, on the same activations (every
    // path quantizes identically).
    default: avx2::rows(type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
  }
}

}  // namespace avx512
#pragma GCC pop_options

// ---------------------------------------------------------------------------------------------
// Entry points.

namespace {

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

void check_type(int64_t type) {
  TORCH_CHECK(block_bytes(type) > 0, "ggml type ", type, " is not supported (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, "
              "Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS are)");
}

void check_weight(const torch::Tensor& w, int64_t type, int64_t out_features, int64_t in_features) {
  check_type(type);
  TORCH_CHECK(w.scalar_type() == torch::kByte && w.is_contiguous(), "weight bytes must be a contiguous uint8 tensor");
  TORCH_CHECK(in_features > 0 && in_features % block_values(type) == 0, "in_features (", in_features,
              ") must be a positive multiple of ", block_values(type));
  TORCH_CHECK(out_features > 0, "out_features must be positive");
  TORCH_CHECK(w.numel() == out_features * (in_features / block_values(type)) * block_bytes(type), "weight has ",
              w.numel(), " bytes, expected ", out_features * (in_features / block_values(type)) * block_bytes(type),
              " for [", out_features, ", ", in_features, "]");
}

}  // namespace

std::vector<std::string> supported_paths() {
  std::vector<std::string> paths;
  if (cpu_has_avx512()) paths.emplace_back("avx512");
  if (cpu_has_avx2()) paths.emplace_back("avx2");
  paths.emplace_back("scalar");
  return paths;
}

namespace {

Path parse_path(const std::string& path) {
  Path p = kScalar;
  if (path == "avx512") p = kAvx512;
  else if (path == "avx2") p = kAvx2;
  else TORCH_CHECK(path == "scalar", "unknown kernel path '", path, "' (avx512, avx2, scalar)");
  TORCH_CHECK(p != kAvx512 || cpu_has_avx512(), "this CPU lacks AVX-512 VNNI");
  TORCH_CHECK(p != kAvx2 || cpu_has_avx2(), "this CPU lacks AVX2");
  return p;
}

// Rows of x quantized for weights of `type`: a buffer, its 64-byte aligned start, the bytes per row.
struct Activations {
  torch::Tensor buffer;
  uint8_t* data;
  int64_t stride;
};

Activations quantize(const torch::Tensor& x, int64_t type, int64_t in_features, Path p) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == in_features, "x must be [rows, ", in_features, "], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16 ||
                  x.scalar_type() == torch::kHalf,
              "x must be float32, bfloat16 or float16");
  const int64_t n = x.size(0), stride = specwise_gguf::activation_stride(type, in_features);
  Activations a{torch::empty({n * stride + 64}, x.options().dtype(torch::kByte)), nullptr, stride};
  a.data = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(a.buffer.data_ptr<uint8_t>()) + 63) & ~uintptr_t(63));
  const auto xf = x.to(torch::kFloat).contiguous();
  const float* xp = xf.data_ptr<float>();
  if (p == kAvx512) quantize_rows<avx512::Quant>(type, xp, n, in_features, a.data, stride);
  else if (p == kAvx2) quantize_rows<avx2::Quant>(type, xp, n, in_features, a.data, stride);
  else quantize_rows<ScalarQuant>(type, xp, n, in_features, a.data, stride);
  return a;
}

}  // namespace

// The kernel's int8 activations as raw bytes [rows, bytes per row] (for tests: every path must agree).
torch::Tensor quantize_activations(const torch::Tensor& x, int64_t type, int64_t in_features, const std::string& path) {
  check_type(type);
  TORCH_CHECK(in_features > 0 && in_features % block_values(type) == 0, "in_features must be a multiple of ",
              block_values(type));
  const Activations a = quantize(x, type, in_features, parse_path(path));
  const int64_t offset = a.data - a.buffer.data_ptr<uint8_t>();
  return a.buffer.narrow(0, offset, x.size(0) * a.stride).view({x.size(0), a.stride}).clone();
}

torch::Tensor gguf_linear(const torch::Tensor& x, const torch::Tensor& w, int64_t type, int64_t out_features,
                          int64_t in_features, const c10::optional<torch::Tensor>& bias, const std::string& path) {
  check_weight(w, type, out_features, in_features);
  const Path p = parse_path(path);
  if (bias.has_value()) TORCH_CHECK(bias->numel() == out_features, "bias must have ", out_features, " values");
  const Activations a = quantize(x, type, in_features, p);
  const int64_t n = x.size(0);
  auto y = torch::empty({n, out_features}, x.options().dtype(torch::kFloat));
  if (n == 0) return y.to(x.scalar_type());
  const int64_t nb = in_features / block_values(type);
  uint8_t* act = a.data;
  const int64_t act_stride = a.stride;

  using RowsFn = void (*)(int64_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t, const uint8_t*, int64_t,
                          int64_t, float*, int64_t);
  const RowsFn rows = p == kAvx512 ? avx512::rows : p == kAvx2 ? avx2::rows : rows_scalar;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t row_bytes = nb * block_bytes(type);
  float* yp = y.data_ptr<float>();
  for (int64_t c0 = 0; c0 < n; c0 += kRowChunk) {
    const int64_t rows_here = std::min(n - c0, kRowChunk);
    at::parallel_for(0, out_features, 16, [&](int64_t o0, int64_t o1) {
      rows(type, wp, row_bytes, o0, o1, nb, act + c0 * act_stride, act_stride, rows_here, yp + c0 * out_features,
           out_features);
    });
  }
  if (bias.has_value()) y.add_(bias->to(torch::kFloat).view({1, out_features}));  // float32, before one rounding
  return y.to(x.scalar_type());
}

namespace {

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

}  // namespace

// Selected rows of the weight as float32, computed as gguf's reference dequantizer does, for embedding lookups.
torch::Tensor dequantize_rows(const torch::Tensor& w, int64_t type, int64_t out_features, int64_t in_features,
                              const torch::Tensor& ids) {
  check_weight(w, type, out_features, in_features);
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == torch::kLong, "ids must be a 1-D int64 tensor");
  const auto idc = ids.contiguous();
  const int64_t* idp = idc.data_ptr<int64_t>();
  const int64_t n = idc.numel();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(idp[i] >= 0 && idp[i] < out_features, "row id ", idp[i], " out of range [0, ", out_features, ")");
  auto y = torch::empty({n, in_features}, torch::kFloat);
  const int64_t nb = in_features / block_values(type), row_bytes = nb * block_bytes(type);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dequantize_row(type, wp + idp[i] * row_bytes, nb, yp + i * in_features);
  });
  return y;
}

// AVX-512 BF16 dequantization of Q4_K / Q6_K rows straight to bfloat16: the same float32 operations as
// dequantize_row (a multiply, then a subtraction; no fused multiply-add), rounded to nearest even by
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

bool row(int64_t type, const uint8_t* w, int64_t nb, uint16_t* dst) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
  if (type == kQ4_K) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * 144;
      const float d = fp16_to_fp32(blk), dmin = fp16_to_fp32(blk + 2);
      uint8_t sc[8], mn[8];
      q4k_scales(blk + 4, sc, mn);
      for (int j = 0; j < 8; ++j) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * (j / 2)));
        const __m256i q = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4) : _mm256_and_si256(raw, m4);
        const __m512 dj = _mm512_set1_ps(d * static_cast<float>(sc[j])), mj = _mm512_set1_ps(dmin * static_cast<float>(mn[j]));
        __m512 lo, hi;
        widen(q, lo, hi);
        store32(dst + b * 256 + 32 * j, _mm512_sub_ps(_mm512_mul_ps(dj, lo), mj), _mm512_sub_ps(_mm512_mul_ps(dj, hi), mj));
      }
    }
    return true;
  }
  if (type == kQ6_K) {
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

// Rows [o0, o1) of the weight as bfloat16 into out [o1 - o0, in_features] (each value dequantized in float32,
// then rounded to nearest even): slabs of a temporary copy for a many-row matmul by PyTorch, never kept.
void dequantize_bf16_rows(const torch::Tensor& w, int64_t type, int64_t out_features, int64_t in_features, int64_t o0,
                          int64_t o1, torch::Tensor& out, bool use_simd) {
  check_weight(w, type, out_features, in_features);
  TORCH_CHECK(0 <= o0 && o0 <= o1 && o1 <= out_features, "rows [", o0, ", ", o1, ") are outside [0, ", out_features, ")");
  TORCH_CHECK(out.scalar_type() == torch::kBFloat16 && out.is_contiguous() && out.dim() == 2 && out.size(0) == o1 - o0 &&
                  out.size(1) == in_features, "out must be contiguous bfloat16 [", o1 - o0, ", ", in_features, "]");
  const int64_t nb = in_features / block_values(type), row_bytes = nb * block_bytes(type);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  auto* yp = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const bool simd = use_simd && cpu_has_avx512_bf16() && (type == kQ4_K || type == kQ6_K);
  at::parallel_for(o0, o1, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(in_features);
    for (int64_t o = r0; o < r1; ++o) {
      uint16_t* dst = yp + (o - o0) * in_features;
      if (simd && bf16dq::row(type, wp + o * row_bytes, nb, dst)) continue;
      dequantize_row(type, wp + o * row_bytes, nb, row.data());
      for (int64_t i = 0; i < in_features; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &row[i], 4);
        dst[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);  // finite weights only
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The internal API of gguf_kernel.h, for gguf_pass.cpp.

namespace specwise_gguf {

int64_t parse_path(const std::string& path) { return ::parse_path(path); }
int64_t block_values(int64_t type) { return ::block_values(type); }
int64_t block_bytes(int64_t type) { return ::block_bytes(type); }

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
    if (path == kAvx512) {
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

void dot_rows(int64_t path, int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
              const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  if (path == kAvx512) avx512::rows(type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
  else if (path == kAvx2) avx2::rows(type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
  else rows_scalar(type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
}

}  // namespace specwise_gguf

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gguf_linear", &gguf_linear, "y = x @ W.T (+ bias) for GGUF block-quantized W (raw bytes)");
  m.def("dequantize_rows", &dequantize_rows, "selected rows of a GGUF block-quantized weight as float32");
  m.def("dequantize_bf16_rows", &dequantize_bf16_rows, "rows of a GGUF block-quantized weight as bfloat16, into out");
  m.def("quantize_activations", &quantize_activations, "the kernel's quantized activation rows as raw bytes");
  m.def("supported_paths", &supported_paths, "kernel paths this CPU can run, fastest first");
  specwise_gguf::bind_pass(m);
}
