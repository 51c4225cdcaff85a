// The AVX-512 path (F, BW, VL, VNNI): 512-bit registers, tiles of up to 16 activation rows per unpacked
// weight block for Q4_K, Q5_K and Q6_K, up to 8 for Q5_0, Q8_0 and IQ4_XS; eight output rows a step for
// Q4_0 (256-bit VNNI), and for many rows of Q4_0 panels of 16 output rows (lanes = output rows);
// the other types go to their AVX2 tiles (gguf_avx2.cpp) on the same activations. A file of its own so
// that one instruction set reads in one place; compiled for baseline x86-64, the code below under a target
// pragma, and run only where the dispatch (gguf_linear.cpp) has found the CPU features.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gguf_activations.h"
#include "gguf_blocks.h"
#include "gguf_eight_rows.h"
#include "gguf_paths.h"

namespace avx512 {
// Outside the target region (the dispatch asks it on any CPU). Every type rows() below has a case for.
bool has_tiles(int64_t type) {
  switch (type) {
    case kQ4_K: case kQ5_K: case kQ6_K: case kQ5_0: case kQ8_0: case kQ4_0: case kIQ4_XS: return true;
    default: return false;
  }
}
}  // namespace avx512

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
// For 2-8 activation rows, Q4_K and Q5_K take two weight rows a step (tile2): the float work and the mins'
// sums run once for both in 16 lanes, which halves what they cost a weight row (on 2 Xeon cores, the
// default target's T(5) 2-5 % lower, builds alternated). A one-row tile computes the same integer sums
// and float operations without the lanes. The activation scales and block sums that the float work needs
// are gathered once per call in lane order (the side data).
constexpr int kTile = 16;

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
// Q5_K (Five) is Q4_K with a fifth bit per value: bit 2k of qh[i] for value 64k + i, bit 2k + 1 for
// 64k + 32 + i, set into the regrouped registers by one vptestmb and one masked vpor each (values 0-31:
// |sum| <= 8 * 31 * 128 = 31744, still a word after vpackssdw).
template <bool Five>
struct Q4KT : TileSide<16, true> {
  static constexpr int64_t kBytes = Five ? 176 : 144, kQs = Five ? 48 : 16;
  static constexpr bool kTwoRows = true;  // tile2: two weight rows share the float work (see there)

  // One weight block unpacked: the four regrouped code registers, the scales as words, the mins as words.
  struct Block {
    __m512i w0, w1, w2, w3, sc;
    __m128i mins;
    float d, dmin;
  };

  static Block unpack(const uint8_t* blk) {
    Block u;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    u.d = half(blk);
    u.dmin = half(blk + 2);
    // The 6-bit scales and mins decoded in general registers, then moved over.
    uint64_t s8;
    std::memcpy(&s8, blk + 4, 8);
    const uint64_t c = load_u32(blk + 12);
    const uint64_t lo = s8 & 0x3f3f3f3f3f3f3f3fULL;  // scales 0-3, mins 0-3
    const uint64_t hi = (c & 0x0f0f0f0fULL) | ((c << 28) & 0x0f0f0f0f00000000ULL) | ((s8 >> 2) & 0x3030303030303030ULL);
    const __m128i scmn = _mm_unpacklo_epi32(_mm_cvtsi64_si128(static_cast<long long>(lo)),
                                            _mm_cvtsi64_si128(static_cast<long long>(hi)));
    // scmn bytes: scales 0-3, scales 4-7, mins 0-3, mins 4-7.
    u.sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(scmn));
    u.mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(scmn, scmn));
    const __m512i r0 = load(blk + kQs), r1 = load(blk + kQs + 64);
    const __m512i first = _mm512_shuffle_i64x2(r0, r1, 0x88), second = _mm512_shuffle_i64x2(r0, r1, 0xdd);
    u.w0 = _mm512_and_si512(first, m4);
    u.w1 = _mm512_and_si512(second, m4);
    u.w2 = _mm512_and_si512(_mm512_srli_epi16(first, 4), m4);
    u.w3 = _mm512_and_si512(_mm512_srli_epi16(second, 4), m4);
    if constexpr (Five) {
      // 128-bit lane k (group k) tests bit 2k (low nibbles) or 2k + 1 (high) of qh[0..15] (quarter 0)
      // or qh[16..31] (quarter 1).
      const __m512i h0 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16)));
      const __m512i h1 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32)));
      const __m512i even = _mm512_setr_epi64(0x0101010101010101LL, 0x0101010101010101LL, 0x0404040404040404LL,
                                             0x0404040404040404LL, 0x1010101010101010LL, 0x1010101010101010LL,
                                             0x4040404040404040LL, 0x4040404040404040LL);
      const __m512i odd = _mm512_add_epi8(even, even), bit = _mm512_set1_epi8(0x10);
      u.w0 = _mm512_or_si512(u.w0, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h0, even), bit));
      u.w1 = _mm512_or_si512(u.w1, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h1, even), bit));
      u.w2 = _mm512_or_si512(u.w2, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h0, odd), bit));
      u.w3 = _mm512_or_si512(u.w3, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h1, odd), bit));
    }
    return u;
  }

  // A row's integer sums against the low nibbles (sub-blocks 2k) and the high ones (2k + 1).
  static __m512i low(const Block& u, const int8_t* q) {
    const __m512i z = _mm512_setzero_si512();
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, u.w0, load(q)), u.w1, load(q + 64));
  }
  static __m512i high(const Block& u, const int8_t* q) {
    const __m512i z = _mm512_setzero_si512();
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, u.w2, load(q + 128)), u.w3, load(q + 192));
  }

  // v[j]: pair j of the MB activation rows (2j, 2j + 1; the second may be missing) against one block,
  // two rows to an accumulator (see the section's comment).
  template <int MB>
  static void pairs(const Block& u, const uint8_t* act, int64_t stride, int64_t b, __m512i* v) {
    const __m512i z = _mm512_setzero_si512();
    // Word scales per 128-bit lane k: 2k (the pairs' low nibbles), 2k + 1 (high).
    const __m512i s_even = _mm512_permutexvar_epi16(LaneIndex<2, 0, 0>::get(), u.sc);
    const __m512i s_odd = _mm512_permutexvar_epi16(LaneIndex<2, 1, 0>::get(), u.sc);
    for (int j = 0; j < (MB + 1) / 2; ++j) {
      const int8_t* qa = row<ActK>(act, 2 * j, stride, b)->qt;
      const int8_t* qb = 2 * j + 1 < MB ? row<ActK>(act, 2 * j + 1, stride, b)->qt : nullptr;
      v[j] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(z, _mm512_packs_epi32(low(u, qa), qb ? low(u, qb) : z), s_even),
                                 _mm512_packs_epi32(high(u, qa), qb ? high(u, qb) : z), s_odd);
    }
  }

  // One weight row of nb blocks against MB activation rows: out[0, MB) (64-byte aligned).
  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, const uint8_t* side,
                   float* out) {
    constexpr int NP = (MB + 1) / 2;
    using L = LanesFor<MB>;
    const __m512i z = _mm512_setzero_si512();
    // Word scales per 128-bit lane k of one row's packed halves: 2k, then 2k + 1.
    const __m512i both = LaneIndex<2, 0, 1>::get();
    typename L::F vacc = L::set1(0.f);
    float sacc = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * kBytes;
      prefetch_ahead(blk, kBytes);
      const Block u = unpack(blk);
      if constexpr (MB == 1) {
        const ActK* a = row<ActK>(act, 0, stride, b);
        const __m128i v = fold4(_mm512_dpwssd_epi32(z, _mm512_packs_epi32(low(u, a->qt), high(u, a->qt)),
                                                    _mm512_permutexvar_epi16(both, u.sc)));
        const __m128i ms = _mm_madd_epi16(u.mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a->bsum32)));
        // Both sums at once: lanes (isum, isum, msum, msum), then (d, d, dmin, dmin) * ad * each.
        __m128i t = _mm_add_epi32(_mm_unpacklo_epi64(v, ms), _mm_unpackhi_epi64(v, ms));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk))));
        const __m128 prod = _mm_mul_ps(_mm_mul_ps(_mm_unpacklo_ps(dd, dd), _mm_set1_ps(a->d)), _mm_cvtepi32_ps(t));
        sacc += _mm_cvtss_f32(prod);
        sacc -= _mm_cvtss_f32(_mm_movehl_ps(prod, prod));
      } else {
        __m512i v[NP];
        pairs<MB>(u, act, stride, b, v);
        const uint8_t* sd = side + b * kSide;
        typename L::I msum = L::zero();
        for (int j = 0; j < 4; ++j) msum = L::dpwssd(msum, L::load_i(sd + 64 + 64 * j), L::dword(u.mins, j));
        const typename L::F ad = L::load(sd);
        vacc = L::add(vacc, L::mul(L::mul(L::set1(u.d), ad), L::cvt(L::of(reduce_pairs<NP>(v)))));
        vacc = L::sub(vacc, L::mul(L::mul(L::set1(u.dmin), ad), L::cvt(msum)));
      }
    }
    if constexpr (MB == 1) out[0] = sacc;
    else L::store(out, vacc);
  }

  // Two weight rows (wa, wb) of nb blocks against 2 <= MB <= 8 activation rows: out[r] for wa's row r,
  // out[8 + r] for wb's (64-byte aligned, 16 floats). The integer work is tile's for each weight row;
  // the mins' sums and the float work run once for both in 16 lanes (wa's rows in lanes 0-7, wb's in
  // 8-15), each lane doing exactly tile's operations, so both results are bit-identical to tile's.
  template <int MB>
  static void tile2(const uint8_t* wa, const uint8_t* wb, int64_t nb, const uint8_t* act, int64_t stride,
                    const uint8_t* side, float* out) {
    static_assert(MB >= 2 && MB <= 8, "two weight rows take tiles of 2-8 activation rows");
    constexpr int NP = (MB + 1) / 2;
    __m512 vacc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* ba = wa + b * kBytes;
      const uint8_t* bb = wb + b * kBytes;
      prefetch_ahead(ba, kBytes);
      prefetch_ahead(bb, kBytes);
      const Block ua = unpack(ba), ub = unpack(bb);
      __m512i va[NP], vb[NP];
      pairs<MB>(ua, act, stride, b, va);
      pairs<MB>(ub, act, stride, b, vb);
      const __m512i isum = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_castsi512_si256(reduce_pairs<NP>(va))),
                                              _mm512_castsi512_si256(reduce_pairs<NP>(vb)), 1);
      // Mins: dwords 0-3 wa's word pairs, 4-7 wb's; pair j to lanes 0-7 (wa) and 8-15 (wb).
      const __m512i mins = _mm512_inserti32x4(_mm512_castsi128_si512(ua.mins), ub.mins, 1);
      const uint8_t* sd = side + b * kSide;
      __m512i msum = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        const __m512i pick = _mm512_inserti64x4(_mm512_set1_epi32(j), _mm256_set1_epi32(4 + j), 1);
        const __m512i bsum = _mm512_broadcast_i64x4(_mm256_load_si256(reinterpret_cast<const __m256i*>(sd + 64 + 64 * j)));
        msum = _mm512_dpwssd_epi32(msum, bsum, _mm512_permutexvar_epi32(pick, mins));
      }
      // (AVX512F forms of the f32x8 broadcast and insert, which are AVX512DQ.)
      const __m512 ad = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_load_pd(reinterpret_cast<const double*>(sd))));
      auto halves = [](float lo, float hi) {
        return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(lo)),
                                                   _mm256_castps_pd(_mm256_set1_ps(hi)), 1));
      };
      const __m512 d = halves(ua.d, ub.d), dmin = halves(ua.dmin, ub.dmin);
      vacc = _mm512_add_ps(vacc, _mm512_mul_ps(_mm512_mul_ps(d, ad), _mm512_cvtepi32_ps(isum)));
      vacc = _mm512_sub_ps(vacc, _mm512_mul_ps(_mm512_mul_ps(dmin, ad), _mm512_cvtepi32_ps(msum)));
    }
    _mm512_store_ps(out, vacc);
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
      prefetch_ahead(blk, 210);
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

// Whether K has tile2 (two weight rows a tile; Q4_K and Q5_K).
template <class K, class = void>
struct TwoRows : std::false_type {};
template <class K>
struct TwoRows<K, std::void_t<decltype(K::kTwoRows)>> : std::bool_constant<K::kTwoRows> {};

// Output rows [o0, o1) against one tile of MB activation rows: y[r * ldy + o].
template <class K, int MB>
void tile_rows(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
               int64_t stride, const uint8_t* side, float* y, int64_t ldy) {
  alignas(64) float acc[kTile];
  int64_t o = o0;
  if constexpr (TwoRows<K>::value && MB >= 2 && MB <= 8) {
    for (; o + 1 < o1; o += 2) {
      K::template tile2<MB>(w + o * row_bytes, w + (o + 1) * row_bytes, nb, act, stride, side, acc);
      for (int r = 0; r < MB; ++r) {
        y[r * ldy + o] = acc[r];
        y[r * ldy + o + 1] = acc[8 + r];
      }
    }
  }
  for (; o < o1; ++o) {
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

// IQ4_XS: a block's 16-byte group j holds sub-block j (values 32j..32j+15 in its low nibbles, 32j+16..
// 32j+31 in its high ones), looked up in kIQ4Values and put in natural order once per block (four
// registers of 64 values, +128 for vpdpbusd: |dword| <= 4 * 241 * 127). Per activation row the dwords are
// multiplied by their sub-block's scale (|scale| <= 32: |lane| < 2^24, exact in float) and the offset's
// 128 * sum_j scale_j * bsum32[j] is taken off as one integer; the float work is one cvt and fmadd per
// block, the lanes summed once per output row.
struct IQ4XS {
  template <int MB>
  static void tile(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
    // Natural order from the low (l) and high (h) nibbles' values: (l0 h0 l1 h1), (l2 h2 l3 h3).
    const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    const __m512i z = _mm512_setzero_si512();
    __m512 acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * 136;
      prefetch_ahead(blk, 136);
      __m512i u[4];
      for (int h = 0; h < 2; ++h) {
        const __m512i raw = load(blk + 8 + 64 * h);
        const __m512i l = _mm512_shuffle_epi8(table, _mm512_and_si512(raw, m4));
        const __m512i hv = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
        u[2 * h] = _mm512_xor_si512(_mm512_permutex2var_epi64(l, first, hv), flip);
        u[2 * h + 1] = _mm512_xor_si512(_mm512_permutex2var_epi64(l, second, hv), flip);
      }
      // u[k]'s dwords 0-7 are sub-block 2k's, 8-15 sub-block 2k + 1's.
      const __m256i sc = iq4xs_scales8(blk);
      const __m512i sc512 = _mm512_castsi256_si512(sc);
      __m512i s[4];
      for (int k = 0; k < 4; ++k)
        s[k] = _mm512_permutexvar_epi32(_mm512_inserti64x4(_mm512_set1_epi32(2 * k), _mm256_set1_epi32(2 * k + 1), 1),
                                        sc512);
      const __m128i sc16 = _mm_packs_epi32(_mm256_castsi256_si128(sc), _mm256_extracti128_si256(sc, 1));
      const float dw = half(blk);
      for (int m = 0; m < MB; ++m) {
        const ActK* a = row<ActK>(act, m, stride, b);
        __m512i v = z;
        for (int k = 0; k < 4; ++k) v = _mm512_add_epi32(v, _mm512_mullo_epi32(_mm512_dpbusd_epi32(z, u[k], load(a->q + 64 * k)), s[k]));
        // The offset: 128 * sum_j scale_j * (sum of sub-block j's activations), off lane 0.
        __m128i o = _mm_madd_epi16(sc16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a->bsum32)));
        o = _mm_add_epi32(o, _mm_unpackhi_epi64(o, o));
        o = _mm_add_epi32(o, _mm_srli_epi64(o, 32));
        v = _mm512_mask_sub_epi32(v, 1, v, _mm512_castsi128_si512(_mm_slli_epi32(o, 7)));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(dw * a->d), acc[m]);
      }
    }
    for (int m = 0; m < MB; ++m) out[m] = _mm512_reduce_add_ps(acc[m]);
  }
};

// Q4_0: avx2::Rows32's eight output rows a step (lanes = output rows, rows k | k + 4 paired in the
// 128-bit lanes), its integer sums by 256-bit vpdpbusd (VNNI + VL: 11 instructions a block and activation
// row where vpmaddubsw / vpmaddwd / vphadd take 17). A one-row 512-bit tile as Q5_0's was measured and
// left out: as fast for one row, 1.4x slower for 8-32 (docs/results/byo-gguf-zen4/kernel-bench.txt).
struct Q4_0Rows {
  template <int MB>
  static void tile(const uint8_t* const* rw, const uint8_t* ahead, int64_t nb, const uint8_t* act, int64_t stride,
                   float* out) {
    constexpr int64_t kBytes = 18;
    const __m256i m4 = _mm256_set1_epi8(0x0F), z = _mm256_setzero_si256();
    __m256 acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk[8];
      const __m256i head = eight_blocks(rw, ahead, b, kBytes, blk);
      const __m256 dw = halves<false>(head);
      __m256i lo[4], hi[4];
      for (int k = 0; k < 4; ++k) {
        const __m256i raw = pair_load(blk[k] + 2, blk[k + 4] + 2);
        lo[k] = _mm256_and_si256(raw, m4);
        hi[k] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      }
      const int h = static_cast<int>(b & 1);
      for (int m = 0; m < MB; ++m) {
        const Act32* a = reinterpret_cast<const Act32*>(act + m * stride) + b / 2;
        const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a->q + 32 * h)));
        const __m256i xh = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a->q + 32 * h + 16)));
        __m256i s[4];
        for (int k = 0; k < 4; ++k) s[k] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(z, lo[k], xl), hi[k], xh);
        __m256i isum = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        isum = _mm256_add_epi32(isum, _mm256_set1_epi32(a->corr[8 * h] >> 4));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(a->d[8 * h])), acc[m]);
      }
    }
    for (int m = 0; m < MB; ++m) _mm256_storeu_ps(out + 8 * m, acc[m]);
  }
};

// 16 bytes at rows + off[r] for the 16 rows of a panel as four vectors, dword lane r of v[t] holding
// row r's bytes 4t..4t+3: four rows a 512-bit register (rows a, a + 4, a + 8, a + 12 in its 128-bit
// lanes), then a 4 x 4 dword transpose within the lanes.
inline void transpose16(const uint8_t* rows, const int64_t* off, __m512i v[4]) {
  __m512i z[4];
  for (int a = 0; a < 4; ++a) {
    __m512i x = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + off[a])));
    x = _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + off[a + 4])), 1);
    x = _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + off[a + 8])), 2);
    z[a] = _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + off[a + 12])), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  v[0] = _mm512_unpacklo_epi64(t0, t2);
  v[1] = _mm512_unpackhi_epi64(t0, t2);
  v[2] = _mm512_unpacklo_epi64(t1, t3);
  v[3] = _mm512_unpackhi_epi64(t1, t3);
}

// The byte offsets of a panel's 16 rows (the last of n repeated), for transpose16, and as dwords for gathers.
inline __m512i panel_offsets(int64_t row_bytes, int n, int64_t* off) {
  alignas(64) int32_t at[16];
  for (int r = 0; r < 16; ++r) at[r] = static_cast<int32_t>(off[r] = std::min(r, n - 1) * row_bytes);
  return _mm512_load_si512(at);
}

// Q4_0 for many activation rows (a prompt): lanes = 16 output rows, each lane's dot product whole.
// Per block the 16 rows' code bytes are copied once into a panel, transposed so that dword lane r of
// vector t holds row r's code bytes 4t..4t+3 (values 4t..4t+3 in their low nibbles, 16+4t..16+4t+3 in
// their high ones); each activation row then takes 8 vpdpbusd with a broadcast dword of its codes per
// block and 16 rows, with no horizontal sums (Q4_0Rows: 8 vpdpbusd and 3 vphaddd per block and 8 rows).
// Every lane computes exactly Q4_0Rows's integer sum (the codes times the activations, plus corr >> 4)
// and the same float operation per block, fma(isum, dw * da, acc): its results are bitwise Q4_0Rows's, so
// a row's result does not depend on which of the two tiles its call takes.
struct Q4_0Panel {
  static constexpr int64_t kBlock = 5 * 64;  // a block's panel: 4 code vectors and the rows' 16 scales
  static void pack(const uint8_t* rows, int64_t row_bytes, int n, int64_t nb, uint8_t* panel) {
    int64_t off[16];
    const __m512i idx = panel_offsets(row_bytes, n, off);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = rows + 18 * b;
      uint8_t* p = panel + kBlock * b;
      __m512i v[4];
      transpose16(blk + 2, off, v);
      for (int t = 0; t < 4; ++t) _mm512_store_si512(p + 64 * t, v[t]);
      const __m512i head = _mm512_i32gather_epi32(idx, blk, 1);
      _mm512_store_ps(p + 256, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)));
    }
  }
  // R activation rows (from act) against the panel's 16 rows: out[16 * m + r].
  template <int R>
  static void tile(const uint8_t* panel, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[R];
    for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = panel + kBlock * b;
      const __m512 dw = _mm512_load_ps(p + 256);
      __m512i lo[4], hi[4];
      for (int t = 0; t < 4; ++t) {
        const __m512i v = _mm512_load_si512(p + 64 * t);
        lo[t] = _mm512_and_si512(v, m4);
        hi[t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
      const int h = static_cast<int>(b & 1);
      for (int m = 0; m < R; ++m) {
        const Act32* a = reinterpret_cast<const Act32*>(act + m * stride) + b / 2;
        const uint8_t* q = reinterpret_cast<const uint8_t*>(a->q + 32 * h);
        __m512i s = _mm512_set1_epi32(a->corr[8 * h] >> 4);
        for (int t = 0; t < 4; ++t) {
          s = _mm512_dpbusd_epi32(s, lo[t], _mm512_set1_epi32(static_cast<int>(load_u32(q + 4 * t))));
          s = _mm512_dpbusd_epi32(s, hi[t], _mm512_set1_epi32(static_cast<int>(load_u32(q + 16 + 4 * t))));
        }
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(a->d[8 * h])), acc[m]);
      }
    }
    for (int m = 0; m < R; ++m) _mm512_store_ps(out + 16 * m, acc[m]);
  }
};

// Rows from which Q4_0 takes its panel tile (fewer: Q4_0Rows, which packs nothing).
constexpr int64_t kPanelRows = 12;

template <class K>
void run_panel(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
               int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  std::vector<uint8_t> store(static_cast<size_t>(nb * K::kBlock + 64));
  uint8_t* panel = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
  alignas(64) float out[64];
  for (int64_t g = o0; g < o1; g += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, o1 - g));
    K::pack(w + g * row_bytes, row_bytes, n, nb, panel);
    for (int64_t r = 0; r < nrows; r += 4) {
      const int rb = static_cast<int>(std::min<int64_t>(4, nrows - r));
      const uint8_t* a = act + r * stride;
      if (rb == 4) K::template tile<4>(panel, nb, a, stride, out);
      else if (rb == 3) K::template tile<3>(panel, nb, a, stride, out);
      else if (rb == 2) K::template tile<2>(panel, nb, a, stride, out);
      else K::template tile<1>(panel, nb, a, stride, out);
      for (int m = 0; m < rb; ++m)
        for (int k = 0; k < n; ++k) y[(r + m) * ldy + g + k] = out[16 * m + k];
    }
  }
}

SPECWISE_EIGHT_ROW_TILES

SPECWISE_ROW_TILES(8)

bool panel(int64_t type, int64_t nrows) { return type == kQ4_0 && nrows >= kPanelRows; }

void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
          int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (type) {
    case kQ4_K: run_k<Q4KT<false>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_K: run_k<Q4KT<true>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ6_K: run_k<Q6K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_0: run<Blocks32<kQ5_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ8_0: run<Blocks32<kQ8_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ4_0:
      if (panel(type, nrows)) run_panel<Q4_0Panel>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
      else run32<Q4_0Rows>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
      break;
    case kIQ4_XS: run<IQ4XS>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    // The other types have no AVX-512 tiles yet (has_tiles is false): their AVX2 tiles run them, on the same
    // activations (every path quantizes identically).
    default: avx2::rows(type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
  }
}

}  // namespace avx512
#pragma GCC pop_options
