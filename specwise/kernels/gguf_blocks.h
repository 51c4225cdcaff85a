// The GGUF block types as the kernel reads them: ggml's type ids, the size of each type's blocks, and the
// decoders of packed fields (fp16 scales, 6-bit scale sets, 4-bit codes, fifth bits, 2- and 3-bit values)
// that several of the kernel's files use: the scalar path, the SIMD tiles' scale decoding, the dequantizers.
//
// A header of inline functions with internal linkage (an unnamed namespace), included before any target
// pragma: every translation unit of the module gets its own baseline x86-64 copy, local to it as a file's
// static helpers are, which its tiles inline into their loops.
#pragma once

#include <cstdint>
#include <cstring>

namespace {

// ggml type ids (ggml.h); anything else is rejected by the Python wrapper and here.
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12,
                  kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23;

// A flag on a type id: the weight is in the 16-row interleaved layout of gguf_interleaved.h. Sizes are the
// base type's (the layout moves bytes, it adds none).
constexpr int64_t kInterleaved = 256;

constexpr int64_t block_bytes(int64_t type) {
  switch (type & ~kInterleaved) {
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
constexpr bool super_block(int64_t flagged) {
  const int64_t type = flagged & ~kInterleaved;
  return type == kQ2_K || type == kQ3_K || type == kQ4_K || type == kQ5_K || type == kQ6_K || type == kIQ4_XS;
}
constexpr int64_t block_values(int64_t type) { return super_block(type) ? 256 : 32; }

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

// Q6_K's value idx: four low bits from ql (a block's first 128 bytes), two high bits from qh (the next 64).
inline int q6k_value(const uint8_t* ql, const uint8_t* qh, int idx) {
  const int h = idx / 128, r = idx % 128, s = r / 32, l = r % 32;
  const uint8_t lo = ql[64 * h + 32 * (s & 1) + l];
  const int nib = s >= 2 ? (lo >> 4) : (lo & 0xF);
  return nib | (((qh[32 * h + l] >> (2 * s)) & 3) << 4);  // 0..63, offset 32
}

// Q2_K's and Q3_K's 2-bit codes: value 128h + 32s + l is bits 2s, 2s + 1 of byte 32h + l.
inline int crumb(const uint8_t* qs, int idx) { return (qs[32 * (idx / 128) + idx % 32] >> (2 * (idx % 128 / 32))) & 3; }

// Q3_K: 0..7 (offset 4), the third bit being bit idx / 32 of hmask byte idx % 32.
inline int q3k_value(const uint8_t* blk, int idx) {
  return crumb(blk + 32, idx) | (((blk[idx % 32] >> (idx / 32)) & 1) << 2);
}

// The SIMD tiles that read a weight row block by block (the K-quants and IQ4_XS) prefetch the bytes
// kPrefetchAhead past each block into L1: the row's later blocks, then the next rows'. With the hardware
// prefetcher alone the loads wait on memory, for every tile size.
//  - AVX-512 tiles, Zen 4, the target's linear layers: T(2) 0.83-0.86x with it than without, T(1) unchanged;
//    prefetching into L2 instead (T1 / T2 hints) made T(1) 13 % and T(2) 24-26 % slower, and other distances
//    (576-9216) moved T(1) by 3 % or less.
//  - AVX-512 tiles, 2 cores of an Intel Xeon (KVM, weights on huge pages), the whole pass, builds alternated in
//    one process: without prefetching T(1) 43.7 ms, T(5) 67.2; 1152 bytes ahead 36.7-37.1, 56.1-56.5; 1728 35.8,
//    54.9; 2304 35.3-35.5, 54.2-54.6; 3072 35.5, 54.7; 4608 36.1, 55.4.
//  - AVX2 tiles forced on that Xeon (whole pass, default target, builds alternated): T(1) 48.1 ms without, 35.9
//    with; T(2) 63.5 and 43.5; T(4) 91.3 and 59.0; T(5) 86.2 and 68.9. Not yet measured on an AVX2-only CPU,
//    where this path is the default.
// On Intel CPUs the bytes kFarAhead past each block are also prefetched into L2 (prefetcht2), so that the
// lines are on their way well before the L1 prefetch asks for them:
//  - AVX-512 tiles, 2 cores of the Intel Xeon above, the whole pass (`bench cost`), builds alternated in 10
//    rounds: T(1) 32.2-34.5 ms against 34.8-38.2 without (3-13 % less in every round), T(5) 52.3-60.6 against
//    54.7-61.5, T(16) 128.3-128.7 against 132.5-133.1; 2, 4 and 8 times kPrefetchAhead within the noise of
//    each other. Streaming the 191 MB Q6_K output layer alone: 12.4-12.9 ns a block and core against
//    13.3-13.6 at one row, 18.2-18.3 against 20.4-20.9 at five. A run-time test of the vendor in this loop
//    instead of the build's flag lost the gain (alternated: T(1) 37.9-38.4 ms, the prefetch compiled in
//    unconditionally 33.3-33.9).
//  - Not measured on AMD CPUs, where L2 hints alone (without the L1 prefetch) were slower (above): off there.
//    The build defines SPECWISE_FAR_PREFETCH on Intel CPUs (kernels/gguf.py).
constexpr int64_t kPrefetchAhead = 2304, kFarAhead = 4 * kPrefetchAhead;
#ifdef SPECWISE_FAR_PREFETCH
constexpr bool kFarPrefetch = true;
#else
constexpr bool kFarPrefetch = false;
#endif
inline void prefetch_ahead(const uint8_t* blk, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) {
    __builtin_prefetch(blk + kPrefetchAhead + i, 0, 3);  // prefetcht0
    if constexpr (kFarPrefetch) __builtin_prefetch(blk + kFarAhead + i, 0, 1);  // prefetcht2
  }
}

}  // namespace
