// The side data of a Q4_K (Q5_K) block in the interleaved layout (gguf_interleaved.h: the 16 d, the 16
// dmin, the three runs of scale bytes) decoded in 16 lanes, lanes = rows (get_scale_min_k4, gguf_blocks.h).
// For the AVX-512 and AMX tiles of that layout: include it under their target options (its functions are
// inline and compile with the includer's instruction set).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace {

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

}  // namespace
