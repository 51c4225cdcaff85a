// The AVX-512 tiles of the interleaved layout (gguf_interleaved.h): Q4_K in groups of 16 output rows, lanes =
// rows. Per block and group the codes are unpacked once (a load, an and, a shift, an and per 64 codes) and
// the scales, mins and d decoded once into 16 lanes; each activation row then costs its 64 vpdpbusd (a
// broadcast dword of its codes against 16 rows' 4 codes), 8 conversions and fused multiply-adds that apply
// the sub-block scales (d * scale is exact in float32: 11 by 6 bits), 4 vpdpwssd for the mins against its
// sub-block sums, and one multiply-add by its scale: no horizontal sum, nothing per (row, block) that the
// format asks again. Every lane takes the same operations in the same order whatever the number of
// activation rows in its tile, so a row's result does not depend on the rows beside it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gguf_activations.h"
#include "gguf_interleaved.h"
#include "gguf_paths.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
namespace avx512 {
namespace {

constexpr int64_t kGroupBlock = 16 * 144;  // one block of a Q4_K group
constexpr int kMaxRows = 8;                // activation rows a tile holds

// A group's block b decoded for the float work: the sub-blocks' d * scale, the mins as word pairs, dmin.
struct Side {
  __m512 scale[8];
  __m512i mins[4];  // dword lane r: (min 2j, min 2j + 1) of row r, as words
  __m512 dmin;
};

inline Side decode(const uint8_t* blk) {
  Side s;
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2048)));
  s.dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2080)));
  const __m512i b0 = _mm512_loadu_si512(blk + 2112), b1 = _mm512_loadu_si512(blk + 2176),
                b2 = _mm512_loadu_si512(blk + 2240);
  const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
  __m512i mn[8];
  for (int t = 0; t < 4; ++t) {  // get_scale_min_k4 (gguf_blocks.h) in 16 lanes
    const __m512i sc_lo = _mm512_and_si512(_mm512_srli_epi32(b0, 8 * t), m6);
    const __m512i mn_lo = _mm512_and_si512(_mm512_srli_epi32(b1, 8 * t), m6);
    const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b2, 8 * t), m4),
                                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b0, 8 * t + 6), m2), 4));
    const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b2, 8 * t + 4), m4),
                                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b1, 8 * t + 6), m2), 4));
    s.scale[t] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_lo));
    s.scale[t + 4] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_hi));
    mn[t] = mn_lo;
    mn[t + 4] = mn_hi;
  }
  for (int j = 0; j < 4; ++j) s.mins[j] = _mm512_or_si512(mn[2 * j], _mm512_slli_epi32(mn[2 * j + 1], 16));
  return s;
}

// MB activation rows against one group (nb blocks from g): out[16 m + r] = row m . weight row r.
template <int MB>
void tile(const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc[MB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = g + b * kGroupBlock;
    const Side s = decode(blk);
    const ActK* a[MB];
    __m512 part[MB];
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      a[m] = reinterpret_cast<const ActK*>(act + m * stride) + b;
      part[m] = _mm512_setzero_ps();
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m512i lo[MB], hi[MB];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) lo[m] = hi[m] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m512i c = _mm512_loadu_si512(blk + 64 * (8 * k + i));
        const __m512i wl = _mm512_and_si512(c, m4), wh = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
          const uint8_t* q = reinterpret_cast<const uint8_t*>(a[m]->q) + 64 * k + 4 * i;
          lo[m] = _mm512_dpbusd_epi32(lo[m], wl, _mm512_set1_epi32(static_cast<int>(load_u32(q))));
          hi[m] = _mm512_dpbusd_epi32(hi[m], wh, _mm512_set1_epi32(static_cast<int>(load_u32(q + 32))));
        }
      }
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        part[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[m]), s.scale[2 * k], part[m]);
        part[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[m]), s.scale[2 * k + 1], part[m]);
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const uint8_t* bs = reinterpret_cast<const uint8_t*>(a[m]->bsum32);
      __m512i msum = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j)
        msum = _mm512_dpwssd_epi32(msum, s.mins[j], _mm512_set1_epi32(static_cast<int>(load_u32(bs + 4 * j))));
      part[m] = _mm512_fnmadd_ps(s.dmin, _mm512_cvtepi32_ps(msum), part[m]);
      acc[m] = _mm512_fmadd_ps(part[m], _mm512_set1_ps(a[m]->d), acc[m]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}

template <int M = kMaxRows>
inline void tile_n(int mb, const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
  if constexpr (M > 0) {
    if (mb == M) tile<M>(g, nb, act, stride, out);
    else tile_n<M - 1>(mb, g, nb, act, stride, out);
  }
}

}  // namespace

void rows_interleaved(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
                      const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  (void)type;  // Q4_K, the one interleavable type (gguf_interleaved.h)
  alignas(64) float out[16 * kMaxRows];
  for (int64_t g0 = o0 / kGroupRows * kGroupRows; g0 < o1; g0 += kGroupRows) {
    const int64_t lo = std::max(o0, g0), hi = std::min(o1, g0 + kGroupRows);
    for (int64_t r = 0; r < nrows; r += kMaxRows) {
      const int mb = static_cast<int>(std::min<int64_t>(kMaxRows, nrows - r));
      tile_n(mb, w + g0 * row_bytes, nb, act + r * stride, stride, out);
      for (int m = 0; m < mb; ++m)
        for (int64_t o = lo; o < hi; ++o) y[(r + m) * ldy + o] = out[16 * m + (o - g0)];
    }
  }
}

}  // namespace avx512
#pragma GCC pop_options
