// The AVX2 path (with FMA and F16C): 256-bit registers, up to 8 activation rows per unpacked weight block,
// for every block type. The K-quants' tiles take one output row against up to 8 activation rows (lanes =
// activation rows); the 32-value types' and IQ4_XS's take eight output rows a step (lanes = output rows). A file of its own so that one instruction set reads in one place; it is compiled
// for baseline x86-64 like the rest, the code below under a target pragma, and runs only where the
// dispatch (gguf_linear.cpp) has found the CPU features. AVX-512 CPUs run it too for the types without
// AVX-512 tiles.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_activations.h"
#include "gguf_blocks.h"
#include "gguf_eight_rows.h"
#include "gguf_paths.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {

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
      prefetch_ahead(blk, block_bytes(Type));
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
      prefetch_ahead(blk, block_bytes(Type));
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
      prefetch_ahead(blk, 84);
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

// The 32-value types run eight output rows a step, lanes = output rows (the K-quant tiles' idea turned
// round: there a block's sums of several activation rows share the float work; here a block's sums of
// eight weight rows do, and every activation load serves the eight). Two rows' blocks share a register,
// row k in the low 128-bit lane and row k + 4 in the high one (Pair), values 0-15 in one register and
// 16-31 in another, against the activation's two halves each broadcast to both lanes; horizontal adds
// then leave row r's block sum in dword r. Per activation row and block the float work is one
// acc += float(isum) * (d * ad), lane r = output row r, and a tail of fewer than eight rows repeats its last
// row in the missing lanes: a row sees the same float operations whichever group or thread range it falls
// in, and an activation row the same whichever other activation rows share the tile. The integer sums are
// exact (bounds at each step).
//
// Q4_0 and Q5_0 multiply the unsigned codes (0-15, 0-31) and subtract offset * (sum of the activation
// codes), which Act32's corr holds (-16 * sum for Q5_0; -128 * sum for the others, shifted to -8 * sum);
// Q4_1 and Q5_1 multiply the same codes and add m * ad * (sum of codes) in a float term of their own.
// Q8_0 and IQ4_NL hold signed values: their signs move onto the activations (vpsignb) and vpmaddubsw takes
// the magnitudes (up to 128 unsigned: a stored -128 stays exact).

// Q5_0's and Q5_1's fifth bits of rows k (low lane) and k + 4 (high lane): 0x10 in byte i of each lane for
// value i (low: values 0-15) or 16 + i (high).
inline void fifth_pair(const uint8_t* qh_k, const uint8_t* qh_k4, __m256i& lo, __m256i& hi) {
  const __m256i bits = _mm256_set_m128i(_mm_cvtsi32_si128(static_cast<int>(load_u32(qh_k4))),
                                        _mm_cvtsi32_si128(static_cast<int>(load_u32(qh_k))));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i spread_lo = _mm256_set_epi64x(0x0101010101010101LL, 0, 0x0101010101010101LL, 0);
  const __m256i spread_hi = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                              0x0303030303030303LL, 0x0202020202020202LL);
  const __m256i five = _mm256_set1_epi8(0x10);
  const __m256i bl = _mm256_and_si256(_mm256_shuffle_epi8(bits, spread_lo), bit);
  const __m256i bh = _mm256_and_si256(_mm256_shuffle_epi8(bits, spread_hi), bit);
  lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(bl, bit), five));
  hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(bh, bit), five));
}

template <int64_t Type>
struct Rows32 {
  static constexpr int64_t kBytes = block_bytes(Type);
  static constexpr bool kSigned = Type == kQ8_0 || Type == kIQ4_NL;
  static constexpr bool kMin = Type == kQ4_1 || Type == kQ5_1;
  // Where the codes start: after d (and m, and the fifth bits).
  static constexpr int64_t qs = Type == kQ5_1 ? 8 : Type == kQ5_0 ? 6 : Type == kQ4_1 ? 4 : 2;

  // Up to 8 activation rows against the eight weight rows rw[0..7]: out[8 * m + r] = row r . activation m.
  // `ahead`: the 8 * nb blocks to prefetch (the next group's rows).
  template <int MB>
  static void tile(const uint8_t* const* rw, const uint8_t* ahead, int64_t nb, const uint8_t* act, int64_t stride,
                   float* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[MB], macc[kMin ? MB : 1];
    for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
    if constexpr (kMin)
      for (int m = 0; m < MB; ++m) macc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk[8];
      const __m256i head = eight_blocks(rw, ahead, b, kBytes, blk);
      const __m256 dw = halves<false>(head);
      // lo[k], hi[k]: values 0-15 and 16-31 of rows k | k + 4 (codes, or signed values and their magnitudes).
      __m256i lo[4], hi[4], alo[4], ahi[4];
      for (int k = 0; k < 4; ++k) {
        if constexpr (Type == kQ8_0) {
          lo[k] = pair_load(blk[k] + 2, blk[k + 4] + 2);
          hi[k] = pair_load(blk[k] + 18, blk[k + 4] + 18);
        } else {
          const __m256i raw = pair_load(blk[k] + qs, blk[k + 4] + qs);
          lo[k] = _mm256_and_si256(raw, m4);
          hi[k] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
          if constexpr (Type == kQ5_0 || Type == kQ5_1) {
            constexpr int64_t qh = Type == kQ5_0 ? 2 : 4;
            fifth_pair(blk[k] + qh, blk[k + 4] + qh, lo[k], hi[k]);
          }
          if constexpr (Type == kIQ4_NL) {
            const __m256i table =
                _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
            lo[k] = _mm256_shuffle_epi8(table, lo[k]);
            hi[k] = _mm256_shuffle_epi8(table, hi[k]);
          }
        }
        if constexpr (kSigned) {
          alo[k] = _mm256_abs_epi8(lo[k]);
          ahi[k] = _mm256_abs_epi8(hi[k]);
        }
      }
      const int h = static_cast<int>(b & 1);
      for (int m = 0; m < MB; ++m) {
        const Act32* a = reinterpret_cast<const Act32*>(act + m * stride) + b / 2;
        const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a->q + 32 * h)));
        const __m256i xh =
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a->q + 32 * h + 16)));
        __m256i isum;
        if constexpr (kSigned) {
          // Per pair: words of 2 products (|w| <= 2 * 128 * 127 = 32512), dwords of 8 (lo + hi), rows k | k + 4.
          __m256i s[4];
          for (int k = 0; k < 4; ++k)
            s[k] = _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_maddubs_epi16(alo[k], _mm256_sign_epi8(xl, lo[k])), ones),
                _mm256_madd_epi16(_mm256_maddubs_epi16(ahi[k], _mm256_sign_epi8(xh, hi[k])), ones));
          // (r0 r0 r1 r1 | r4 r4 r5 r5), (r2 r2 r3 r3 | r6 r6 r7 r7), then (r0 r1 r2 r3 | r4 r5 r6 r7).
          isum = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        } else {
          // Per pair: words of 4 products (|w| <= 4 * 31 * 128 = 15872), rows k | k + 4; a vphaddw makes
          // them 8 (<= 31744), vpmaddwd 16 as (r0 r0 r1 r1 | r4 r4 r5 r5) and (r2 r2 r3 r3 | r6 r6 r7 r7).
          __m256i p[4];
          for (int k = 0; k < 4; ++k)
            p[k] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[k], xl), _mm256_maddubs_epi16(hi[k], xh));
          isum = _mm256_hadd_epi32(_mm256_madd_epi16(_mm256_hadd_epi16(p[0], p[1]), ones),
                                   _mm256_madd_epi16(_mm256_hadd_epi16(p[2], p[3]), ones));
          if constexpr (Type == kQ5_0) isum = _mm256_add_epi32(isum, _mm256_set1_epi32(a->corr[8 * h]));
          if constexpr (Type == kQ4_0) isum = _mm256_add_epi32(isum, _mm256_set1_epi32(a->corr[8 * h] >> 4));
        }
        const __m256 ad = _mm256_set1_ps(a->d[8 * h]);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, ad), acc[m]);
        if constexpr (kMin)
          macc[m] = _mm256_fmadd_ps(_mm256_mul_ps(halves<true>(head), ad),
                                    _mm256_set1_ps(static_cast<float>(act32_sum(*a, h))), macc[m]);
      }
    }
    for (int m = 0; m < MB; ++m)
      _mm256_storeu_ps(out + 8 * m, kMin ? _mm256_add_ps(acc[m], macc[m]) : acc[m]);
  }
};

// IQ4_XS as the 32-value types: eight output rows a step, lanes = output rows, each 32-value sub-block
// paired as in Rows32 (rows k | k + 4; the codes looked up in kIQ4Values, their signs moved onto the
// activations), its words of two products (|w| <= 2 * 127 * 127 = 32258) times the two rows' sub-block
// scales by vpmaddwd (|scale| <= 32), summed over the block's eight sub-blocks (|row sum| <= 256 * 127 * 127
// * 32 < 2^28), and the float work once per block for the eight rows. A block's eight rows are unpacked
// once into a buffer (in L1) that every activation row of the tile reads.
struct IQ4XS8 {
  template <int MB>
  static void tile(const uint8_t* const* rw, const uint8_t* ahead, int64_t nb, const uint8_t* act, int64_t stride,
                   float* out) {
    constexpr int64_t kBytes = 136;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
    __m256 acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
    // Per sub-block j and pair k: values 0-15 and 16-31 (signed), their magnitudes, and the scales as words.
    __m256i vals[8][4][4], scales[8][4];
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk[8];
      const __m256i head = eight_blocks(rw, ahead, b, kBytes, blk);
      const __m256 dw = halves<false>(head);
      for (int k = 0; k < 4; ++k) {
        // Row k's eight scales as words in the low lane, row k + 4's in the high one.
        const __m256i sp = _mm256_permute4x64_epi64(
            _mm256_packs_epi32(iq4xs_scales8(blk[k]), iq4xs_scales8(blk[k + 4])), 0xD8);
        for (int j = 0; j < 8; ++j) {
          scales[j][k] = _mm256_shuffle_epi8(sp, _mm256_set1_epi16(static_cast<short>((2 * j + 1) << 8 | 2 * j)));
          const __m256i raw = pair_load(blk[k] + 8 + 16 * j, blk[k + 4] + 8 + 16 * j);
          const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(raw, m4));
          const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
          vals[j][k][0] = lo;
          vals[j][k][1] = hi;
          vals[j][k][2] = _mm256_abs_epi8(lo);
          vals[j][k][3] = _mm256_abs_epi8(hi);
        }
      }
      for (int m = 0; m < MB; ++m) {
        const ActK* a = reinterpret_cast<const ActK*>(act + m * stride) + b;
        __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int j = 0; j < 8; ++j) {
          const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a->q + 32 * j)));
          const __m256i xh =
              _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a->q + 32 * j + 16)));
          for (int k = 0; k < 4; ++k) {
            const __m256i pl = _mm256_maddubs_epi16(vals[j][k][2], _mm256_sign_epi8(xl, vals[j][k][0]));
            const __m256i ph = _mm256_maddubs_epi16(vals[j][k][3], _mm256_sign_epi8(xh, vals[j][k][1]));
            s[k] = _mm256_add_epi32(s[k], _mm256_add_epi32(_mm256_madd_epi16(pl, scales[j][k]),
                                                           _mm256_madd_epi16(ph, scales[j][k])));
          }
        }
        const __m256i isum = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(a->d)), acc[m]);
      }
    }
    for (int m = 0; m < MB; ++m) _mm256_storeu_ps(out + 8 * m, acc[m]);
  }
};

SPECWISE_EIGHT_ROW_TILES

void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
          int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (type) {
    case kQ4_K: run_k<Q4K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ6_K: run_k<Q6K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_0: run32<Rows32<kQ5_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ8_0: run32<Rows32<kQ8_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_K: run_k<Q5K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ3_K: run_k<Q3K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ2_K: run_k<Q2K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kIQ4_XS: run32<IQ4XS8>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ4_0: run32<Rows32<kQ4_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kIQ4_NL: run32<Rows32<kIQ4_NL>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ4_1: run32<Rows32<kQ4_1>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_1: run32<Rows32<kQ5_1>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
  }
}

}  // namespace avx2
#pragma GCC pop_options
