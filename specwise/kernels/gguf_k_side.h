// The K-quants' interleaved layout (gguf_interleaved.h) read in 16 lanes, lanes = rows: the side data of a
// Q4_K (Q5_K) block (the 16 d, the 16 dmin, the three runs of scale bytes; get_scale_min_k4, gguf_blocks.h),
// the codes of a Q6_K chunk, and IQ4_XS's sub-block scales and value table. For the AVX-512 and AMX tiles of that layout: include it under their target
// options (its functions are inline and compile with the includer's instruction set).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "gguf_interleaved.h"

namespace {

// Q6_K's fields in a group block: ql's 32 runs, then qh's 16, the scales' (a run per sub-block), the d.
constexpr int64_t kQ6Qh = field_offset(kQ6_K, 1), kQ6Scales = field_offset(kQ6_K, 2), kQ6D = field_offset(kQ6_K, 3);

// Q6_K's chunk (h, l), l a multiple of 4 below 32: value 128 h + 32 j + l is the low (j < 2) or high nibble
// of ql byte 64 h + 32 (j & 1) + l with bits 2 j, 2 j + 1 of qh byte 32 h + l above it (gguf_blocks.h,
// q6k_value), so three runs give, for each j < 4, 16 rows' values 128 h + 32 j + l .. + 3.
struct Q6Chunk {
  int64_t ql0, ql1, qh;  // the runs' offsets in a group block: ql for j even, for j odd, and qh

  Q6Chunk(int h, int l)
      : ql0(64 * ((64 * h + l) / 4)), ql1(64 * ((64 * h + 32 + l) / 4)), qh(kQ6Qh + 64 * ((32 * h + l) / 4)) {}

  // The chunk's codes (0 .. 63) for j < 4, from its three runs' registers: each high pair moved to bits 4-5
  // by one shift and set in by one vpternlogd (the 16-bit shifts' spill into the next byte is masked).
  static void codes(__m512i ql0, __m512i ql1, __m512i qh, __m512i w[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i lo[4] = {_mm512_and_si512(ql0, m4), _mm512_and_si512(ql1, m4),
                           _mm512_and_si512(_mm512_srli_epi16(ql0, 4), m4), _mm512_and_si512(_mm512_srli_epi16(ql1, 4), m4)};
    const __m512i up[4] = {_mm512_slli_epi16(qh, 4), _mm512_slli_epi16(qh, 2), qh, _mm512_srli_epi16(qh, 2)};
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) w[j] = _mm512_ternarylogic_epi32(lo[j], up[j], m30, 0xF8);  // lo | (up & m30)
  }
};

// Decoded a sub-block at a time where it is used, so that few registers hold it.
struct Side {
  __m512 d, dmin;
  __m512i b0, b1, b2;

  explicit Side(const uint8_t* side)
      : d(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(side)))),
        dmin(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(side + 32)))),
        b0(_mm512_loadu_si512(side + 64)), b1(_mm512_loadu_si512(side + 128)), b2(_mm512_loadu_si512(side + 192)) {}

  // Sub-block s's scale (Min: its min) in each row's lane.
  template <bool Min>
  __m512i get(int s) const {
    const __m512i lo = Min ? b1 : b0;
    if (s < 4) return _mm512_and_si512(_mm512_srli_epi32(lo, 8 * s), _mm512_set1_epi32(63));
    const int t = s - 4;
    return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b2, 8 * t + (Min ? 4 : 0)), _mm512_set1_epi32(15)),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(lo, 8 * t + 6), _mm512_set1_epi32(3)), 4));
  }
  // Mins 2 j and 2 j + 1 as the words of each row's dword.
  __m512i min_pair(int j) const { return _mm512_or_si512(get<true>(2 * j), _mm512_slli_epi32(get<true>(2 * j + 1), 16)); }
};

// IQ4_XS's fields in a group block: the codes' 32 runs, then the d, the scales' high bits, their low bits.
constexpr int64_t kIQ4D = field_offset(kIQ4_XS, 1), kIQ4ScalesH = field_offset(kIQ4_XS, 2),
                  kIQ4ScalesL = field_offset(kIQ4_XS, 3);

// IQ4_XS's sub-block scales of a group block (iq4xs_scales, gguf_blocks.h), decoded one at a time.
struct IQ4Side {
  __m512i sh, sl;

  explicit IQ4Side(const uint8_t* blk)
      : sh(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kIQ4ScalesH)))),
        sl(_mm512_loadu_si512(blk + kIQ4ScalesL)) {}

  // Sub-block j's signed scale (in [-32, 31]) in each row's lane.
  __m512i scale(int j) const {
    return _mm512_sub_epi32(
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sl, 4 * j), _mm512_set1_epi32(15)),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * j), _mm512_set1_epi32(3)), 4)),
        _mm512_set1_epi32(32));
  }

  // kIQ4Values moved to unsigned (+128, a flip of bit 7) once, in each 128-bit lane, for vpshufb to look up.
  static __m512i unsigned_table() {
    return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values))),
                            _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};

}  // namespace
