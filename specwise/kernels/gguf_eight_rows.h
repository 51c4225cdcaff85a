// The 256-bit pieces of the eight-output-row tiles (lanes = output rows), which the AVX2 path's tiles and
// the AVX-512 path's Q4_0 tile share: a group's blocks located, prefetched and their first dwords
// gathered, two rows' 16 bytes side by side, the fp16 scales of eight rows, IQ4_XS's scales.
//
// Compiled for AVX2, FMA and F16C (target options below): the AVX-512 path, whose options include
// those, inlines them too. Internal linkage, as gguf_blocks.h: each translation unit keeps its own copy.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "gguf_blocks.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {

// Block b of the eight weight rows rw[0..7] (`bytes` a block): their addresses into blk, and their first
// dwords (d, and Q4_1's / Q5_1's m) in dword order 0..7. Eight short streams at once defeat the hardware
// prefetcher, so the next group's rows (`ahead`, contiguous) are fetched here as one stream, eight
// blocks' worth a step.
inline __m256i eight_blocks(const uint8_t* const* rw, const uint8_t* ahead, int64_t b, int64_t bytes,
                            const uint8_t** blk) {
  for (int r = 0; r < 8; ++r) blk[r] = rw[r] + b * bytes;
  for (int64_t l = 0; l < 8 * bytes; l += 64)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + 8 * bytes * b + l), _MM_HINT_T0);
  return _mm256_setr_epi32(
      static_cast<int>(load_u32(blk[0])), static_cast<int>(load_u32(blk[1])), static_cast<int>(load_u32(blk[2])),
      static_cast<int>(load_u32(blk[3])), static_cast<int>(load_u32(blk[4])), static_cast<int>(load_u32(blk[5])),
      static_cast<int>(load_u32(blk[6])), static_cast<int>(load_u32(blk[7])));
}

// Rows k and k + 4 of a group: 16 bytes of each (p + 16 * half) side by side.
inline __m256i pair_load(const uint8_t* row_k, const uint8_t* row_k4) {
  return _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(row_k4), reinterpret_cast<const __m128i*>(row_k));
}

// Eight fp16 scales as floats: the low halves of the dwords of v (permuted as (0..3 | 4..7) words), and
// with High the high halves (Q4_1's and Q5_1's m).
template <bool High>
inline __m256 halves(__m256i v) {
  const __m256i pick = High ? _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                               2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)
                            : _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                               0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i words = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, pick), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(words));
}

// IQ4_XS's eight 6-bit sub-block scales (offset 32) of one block as 8 int32 (iq4xs_scales, vectorized): the low
// four bits of scale j are bits 4j.. of the dword at byte 4, the high two bits 2j.. of the word at byte 2.
inline __m256i iq4xs_scales8(const uint8_t* blk) {
  const __m256i lo = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(load_u32(blk + 4))),
                                       _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
  const __m256i hi = _mm256_srlv_epi32(_mm256_set1_epi32(blk[2] | blk[3] << 8),
                                       _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
  const __m256i sc = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0x0F)),
                                     _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4));
  return _mm256_sub_epi32(sc, _mm256_set1_epi32(32));
}

}  // namespace
#pragma GCC pop_options
