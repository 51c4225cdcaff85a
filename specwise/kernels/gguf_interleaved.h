// Weights repacked at load into groups of 16 interleaved output rows (lanes = rows), so that one 512-bit
// register holds 4 values of 16 rows and an activation row's 4 codes broadcast against it: a weight
// register is unpacked once for every activation row held, no horizontal sum is left per row, and the
// per-block side data (scales, mins, d) is decoded once for 16 rows and every activation row. The bytes
// are the stored ones, moved: no value is re-quantized, and the tensor keeps its size and its shape
// [rows, row bytes], whose 16-row stretches each hold one group (tensors of 16k rows only).
//
// Q4_K, block b of a group at group + 2304 b (16 rows' 144-byte blocks b, rearranged):
//   [0, 2048)     the codes: chunk c = 8 k + i (k < 4, i < 8) is 16 dwords, dword r = row r's code bytes
//                 32 k + 4 i .. + 3 (low nibbles: values 64 k + 4 i .. + 3 of sub-block 2 k; high nibbles:
//                 the same places of sub-block 2 k + 1)
//   [2048, 2080)  the rows' d (fp16), [2080, 2112) their dmin
//   [2112, 2304)  the 12 bytes of 6-bit scales and mins: three runs of 16 dwords, run j dword r = row r's
//                 bytes 4 j .. 4 j + 3
// Q5_K, block b at group + 2816 b: the codes as Q4_K's, then [2048, 2560) the fifth bits, chunk c (< 8)
// 16 dwords, dword r = row r's qh bytes 4 c .. + 3, then d, dmin and scales as Q4_K's from 2560.
//
// Q6_K, block b of a group at group + 3360 b:
//   [0, 2048)     the low nibbles: chunk c (< 32) is 16 dwords, dword r = row r's ql bytes 4 c .. + 3
//   [2048, 3072)  the high bits: chunk c (< 16), dword r = row r's qh bytes 4 c .. + 3
//   [3072, 3328)  the int8 sub-block scales: 16 runs of 16 bytes, run s byte r = row r's scale s
//   [3328, 3360)  the rows' d (fp16)
// A type id with kInterleaved set names the layout (kQ4_K | kInterleaved); the Python side records it on
// the weight (specwise.kernels.gguf.GGUFWeight.interleaved).
#pragma once

#include <cstdint>
#include <cstring>

#include "gguf_blocks.h"

namespace {

constexpr int64_t kGroupRows = 16;

constexpr int64_t base_type(int64_t type) { return type & ~kInterleaved; }
constexpr bool interleaved(int64_t type) { return (type & kInterleaved) != 0; }
// The types that have the layout (the AVX-512 path has its tiles).
constexpr bool interleavable(int64_t type) { return type == kQ4_K || type == kQ5_K || type == kQ6_K; }

// Rows 16 g .. 16 g + 15's blocks b (raw, each row `row_bytes` from the last) into one interleaved block.
inline void interleave_block(int64_t type, const uint8_t* raw, int64_t row_bytes, uint8_t* out) {
  for (int r = 0; r < 16; ++r) {
    const uint8_t* blk = raw + r * row_bytes;
    if (type == kQ4_K || type == kQ5_K) {
      const int qs = type == kQ5_K ? 48 : 16, side = type == kQ5_K ? 2560 : 2048;
      for (int c = 0; c < 32; ++c) std::memcpy(out + 64 * c + 4 * r, blk + qs + 4 * c, 4);
      if (type == kQ5_K)
        for (int c = 0; c < 8; ++c) std::memcpy(out + 2048 + 64 * c + 4 * r, blk + 16 + 4 * c, 4);
      std::memcpy(out + side + 2 * r, blk, 2);
      std::memcpy(out + side + 32 + 2 * r, blk + 2, 2);
      for (int j = 0; j < 3; ++j) std::memcpy(out + side + 64 + 64 * j + 4 * r, blk + 4 + 4 * j, 4);
    } else {  // Q6_K
      for (int c = 0; c < 32; ++c) std::memcpy(out + 64 * c + 4 * r, blk + 4 * c, 4);
      for (int c = 0; c < 16; ++c) std::memcpy(out + 2048 + 64 * c + 4 * r, blk + 128 + 4 * c, 4);
      for (int s = 0; s < 16; ++s) out[3072 + 16 * s + r] = blk[192 + s];
      std::memcpy(out + 3328 + 2 * r, blk + 208, 2);
    }
  }
}

// Row r's raw block back from an interleaved block.
inline void raw_block(int64_t type, const uint8_t* blk16, int r, uint8_t* out) {
  if (type == kQ4_K || type == kQ5_K) {
    const int qs = type == kQ5_K ? 48 : 16, side = type == kQ5_K ? 2560 : 2048;
    std::memcpy(out, blk16 + side + 2 * r, 2);
    std::memcpy(out + 2, blk16 + side + 32 + 2 * r, 2);
    for (int j = 0; j < 3; ++j) std::memcpy(out + 4 + 4 * j, blk16 + side + 64 + 64 * j + 4 * r, 4);
    for (int c = 0; c < 32; ++c) std::memcpy(out + qs + 4 * c, blk16 + 64 * c + 4 * r, 4);
    if (type == kQ5_K)
      for (int c = 0; c < 8; ++c) std::memcpy(out + 16 + 4 * c, blk16 + 2048 + 64 * c + 4 * r, 4);
  } else {  // Q6_K
    for (int c = 0; c < 32; ++c) std::memcpy(out + 4 * c, blk16 + 64 * c + 4 * r, 4);
    for (int c = 0; c < 16; ++c) std::memcpy(out + 128 + 4 * c, blk16 + 2048 + 64 * c + 4 * r, 4);
    for (int s = 0; s < 16; ++s) out[192 + s] = blk16[3072 + 16 * s + r];
    std::memcpy(out + 208, blk16 + 3328 + 2 * r, 2);
  }
}

// Row o of an interleaved weight as its raw blocks (nb of them) into out.
inline void raw_row(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t nb, int64_t o, uint8_t* out) {
  const int64_t bytes = block_bytes(type);
  const uint8_t* group = w + (o / kGroupRows) * kGroupRows * row_bytes;
  for (int64_t b = 0; b < nb; ++b)
    raw_block(base_type(type), group + b * kGroupRows * bytes, static_cast<int>(o % kGroupRows), out + bytes * b);
}

// Every group of a [rows, row bytes] weight (rows a multiple of 16) into the layout, in place.
inline void interleave_weight(int64_t type, uint8_t* w, int64_t rows, int64_t row_bytes, int64_t nb, uint8_t* scratch) {
  const int64_t bytes = block_bytes(type);
  for (int64_t g = 0; g < rows; g += kGroupRows) {
    uint8_t* group = w + g * row_bytes;
    std::memcpy(scratch, group, kGroupRows * row_bytes);
    for (int64_t b = 0; b < nb; ++b)
      interleave_block(base_type(type), scratch + b * bytes, row_bytes, group + b * kGroupRows * bytes);
  }
}

}  // namespace
