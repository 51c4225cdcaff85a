// Weights repacked at load into groups of 16 interleaved output rows (lanes = rows), so that one 512-bit
// register holds 4 values of 16 rows and an activation row's 4 codes broadcast against it: a weight
// register is unpacked once for every activation row held, no horizontal sum is left per row, and the
// per-block side data (scales, mins, d) is decoded once for 16 rows and every activation row. The bytes
// are the stored ones, moved: no value is re-quantized, and the tensor keeps its size and its shape
// [rows, row bytes], whose 16-row stretches each hold one group (tensors of 16k rows only).
//
// Block b of a group lies at group + 16 * block_bytes * b and holds the 16 rows' blocks b field by field,
// in the order of the type's Fields below: a field of L bytes at `raw` in a stored block, read in units of
// U bytes (4: dwords of codes, 2: fp16 scales, 1: int8 scales), becomes L / U runs of 16 units, unit r of
// run u being row r's unit u. So a 64-byte run of code dwords is one register of 16 rows' 4 values.
// A type id with kInterleaved set names the layout (kQ4_K | kInterleaved); the Python side records it on
// the weight (specwise.kernels.gguf.GGUFWeight.interleaved).
#pragma once

#include <cstdint>
#include <cstring>

#include "gguf_blocks.h"

namespace {

constexpr int64_t kGroupRows = 16;

// Line o of a group block's twin in the next block into L1 and in the Far-th one on into L2 (Hint 1
// prefetcht2, 2 prefetcht1), issued as the line is loaded (gguf_avx512_interleaved.cpp says why).
template <int64_t Bytes, int Far = 4, int Hint = 1>
inline void prefetch_matched(const uint8_t* blk, int64_t o) {
  __builtin_prefetch(blk + Bytes + o, 0, 3);
  __builtin_prefetch(blk + Far * Bytes + o, 0, Hint);
}

constexpr int64_t base_type(int64_t type) { return type & ~kInterleaved; }
constexpr bool interleaved(int64_t type) { return (type & kInterleaved) != 0; }

struct Field {
  int raw, bytes, unit;
};
struct Fields {
  int n;
  Field f[4];
};

// Each type's fields in layout order (offsets in a stored block; gguf_blocks.h has the formats).
constexpr Fields fields(int64_t type) {
  switch (type) {
    case kQ4_K: return {4, {{16, 128, 4}, {0, 2, 2}, {2, 2, 2}, {4, 12, 4}}};   // codes, d, dmin, scales
    case kQ5_K: return {4, {{48, 128, 4}, {16, 32, 4}, {0, 4, 2}, {4, 12, 4}}};  // codes, fifth bits, d+dmin, scales
    case kQ6_K: return {4, {{0, 128, 4}, {128, 64, 4}, {192, 16, 1}, {208, 2, 2}}};  // ql, qh, scales, d
    case kIQ4_XS: return {4, {{8, 128, 4}, {0, 2, 2}, {2, 2, 2}, {4, 4, 4}}};  // codes, d, scales_h, scales_l
    case kQ8_0: return {2, {{2, 32, 4}, {0, 2, 2}}};                            // values, d
    case kQ4_0: return {2, {{2, 16, 4}, {0, 2, 2}}};                            // nibbles, d
    case kQ5_0: return {3, {{6, 16, 4}, {2, 4, 4}, {0, 2, 2}}};                 // nibbles, fifth bits, d
  }
  return {0, {}};
}

// The types that have the layout (the AVX-512 path has its tiles, gguf_avx512_interleaved.cpp).
constexpr bool interleavable(int64_t type) { return fields(type).n > 0; }

// Where field i of a type starts in an interleaved block.
constexpr int field_offset(int64_t type, int i) {
  int offset = 0;
  for (int k = 0; k < i; ++k) offset += 16 * fields(type).f[k].bytes;
  return offset;
}

// Rows 16 g .. 16 g + 15's blocks b (raw, each row `row_bytes` from the last) into one interleaved block,
// or (back) row r's raw block out of one.
inline void interleave_block(int64_t type, const uint8_t* raw, int64_t row_bytes, uint8_t* out) {
  const Fields fs = fields(type);
  uint8_t* at = out;
  for (int i = 0; i < fs.n; ++i) {
    const Field& f = fs.f[i];
    for (int r = 0; r < 16; ++r)
      for (int u = 0; u < f.bytes / f.unit; ++u)
        std::memcpy(at + (16 * u + r) * f.unit, raw + r * row_bytes + f.raw + u * f.unit, f.unit);
    at += 16 * f.bytes;
  }
}

inline void raw_block(int64_t type, const uint8_t* blk16, int r, uint8_t* out) {
  const Fields fs = fields(type);
  const uint8_t* at = blk16;
  for (int i = 0; i < fs.n; ++i) {
    const Field& f = fs.f[i];
    for (int u = 0; u < f.bytes / f.unit; ++u) std::memcpy(out + f.raw + u * f.unit, at + (16 * u + r) * f.unit, f.unit);
    at += 16 * f.bytes;
  }
}

// Block b of row o of an interleaved weight, as stored, into out.
inline void raw_block_of(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o, int64_t b, uint8_t* out) {
  const uint8_t* group = w + (o / kGroupRows) * kGroupRows * row_bytes;
  raw_block(base_type(type), group + b * kGroupRows * block_bytes(type), static_cast<int>(o % kGroupRows), out);
}

// Row o of an interleaved weight as its raw blocks (nb of them) into out.
inline void raw_row(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t nb, int64_t o, uint8_t* out) {
  for (int64_t b = 0; b < nb; ++b) raw_block_of(type, w, row_bytes, o, b, out + block_bytes(type) * b);
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
