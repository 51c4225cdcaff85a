// The quantized activations every path reads (shared by all paths, so every path sees the same int8
// values): the layouts, ActK for the 256-value types and Act32 for the 32-value ones, which layout a type
// reads, and the side data the SIMD tiles gather per tile of rows. gguf_quantize.cpp writes them.
//
// A header, with internal linkage as gguf_blocks.h, because the tiles of every path read these structs
// in their inner loops: each translation unit keeps its own inlinable copy.
#pragma once

#include <cstdint>
#include <cstring>

#include "gguf_blocks.h"

namespace {

// The activation layout a type reads (kActivationKinds of them): 0, ActK (every 256-value type); 1, Act32
// for Q5_0 (offset 16); 2, Act32 for Q8_0 and every other 32-value type (offset 128: Q4_0 and IQ4_NL ignore
// it, Q4_1 and Q5_1 read their blocks' sums of q from it).
constexpr int activation_kind(int64_t type) { return super_block(type) ? 0 : (type & ~kInterleaved) == kQ5_0 ? 1 : 2; }
constexpr int32_t act32_offset(int64_t type) { return (type & ~kInterleaved) == kQ5_0 ? 16 : 128; }

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

// The block's sum of activation codes, which Act32 holds for offset 128 as corr = -128 * sum.
inline int32_t act32_sum(const Act32& a, int h) { return -a.corr[8 * h] / 128; }

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

}  // namespace
