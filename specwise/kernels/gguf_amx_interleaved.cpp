// The AMX tiles of the interleaved layout (gguf_interleaved.h) for Q4_K: a few to many activation rows
// against 16 weight rows at a time, for the scoring passes of speculative decoding, not only prompts.
//
// The layout is already the weight tile AMX reads: a 64-byte run of a group holds 16 rows' dword u, that is
// B's VNNI order (K/4 rows of 16 columns of 4 bytes), and chunk k of a block (values 64k .. 64k + 63) is the
// low nibbles of runs 8k .. 8k + 7 (values 64k + 4i ..) then their high nibbles (values 64k + 32 + 4i ..).
// The activation rows are the A tile as they lie (16 rows of 64 bytes, their own stride): nothing is packed
// on the activation side.
//
// The sub-block scales go into the weights, exactly: scale = 16 a + b (a < 4, b < 16), and the pieces
// b * code (< 226) and a * code (< 46) are unsigned bytes, made by one vpmullw each over the codes as words
// (two codes below 16 a word: their products never carry into each other). Then per chunk two TDPBSUD
// (signed activations, unsigned pieces) give sums lo and hi with isum = lo + 16 hi, the exact integer
// sum over sub-blocks of scale * (codes . activations) that the scalar path computes; the mins' sum runs
// in vpdpwssd and the float step is the scalar path's, per block and activation row, lanes = weight rows.
// So every row's result is bitwise the scalar path's, whatever the rows beside it.
//
// Per group block the weight side costs 128 vpmullw and their stores, once for every activation row held;
// each activation row then costs its float step and the mins, and its share of 8 tile products.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_activations.h"
#include "gguf_amx_tiles.h"
#include "gguf_blocks.h"
#include "gguf_interleaved.h"
#include "gguf_paths.h"

namespace amx {

// Rows from which a call of an interleaved Q4_K weight takes these tiles (fewer: the AVX-512 tiles of the
// layout, whose few rows cost less than the pieces). The default target's fused gate and up projections,
// 2 threads, Intel Xeon, these tiles over the AVX-512 ones alternated in one process: 1.09 at 6 rows, 0.95 at
// 8, 0.84 at 9, 0.78 at 12, 0.68 at 16 (30.2 against 44.4 ms).
constexpr int64_t kMinRowsInterleaved = 8;

bool takes_interleaved(int64_t type, int64_t nrows) {
  return interleaved(type) && base_type(type) == kQ4_K && nrows >= kMinRowsInterleaved;
}

}  // namespace amx

#if SPECWISE_AMX
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "gguf_k_side.h"
namespace amx {
namespace {

constexpr int64_t kGroupBlock = 16 * 144, kSide = 2048;  // Q4_K's group block, and its side data in it
constexpr int64_t kPieces = 8 * 1024;                    // a block's pieces: 4 chunks of lo, then of hi
constexpr int64_t kRowsPerCall = 64;                     // activation rows held at once

// Block blk's pieces: chunk k's lo at lo + 1024 k (16 tile rows: the low nibbles' 8, then the high ones'),
// hi likewise, as unsigned bytes b * code and a * code of each sub-block's scale 16 a + b.
// Prefetch (the first pair of act tiles, which reads the group from memory): as each code line is loaded,
// its twin in the next group block goes to L1 and in the one after to L2, the side data's with the last
// code loads. The pieces' 128 stores and the float steps leave the loads few slots; a burst of the next
// blocks' lines at the block's start (16 KiB ahead into L2) left the stream behind: at 16 rows, the
// default target's fused gate and up projections on 2 Xeon cores, 0.87-0.89 of that time.
template <bool Prefetch>
inline void make_pieces(const uint8_t* blk, const Side& s, uint8_t* pieces) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m15 = _mm512_set1_epi32(15);
  const auto both_words = [](__m512i x) { return _mm512_or_si512(x, _mm512_slli_epi32(x, 16)); };
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512i sl = s.get<false>(2 * k), sh = s.get<false>(2 * k + 1);
    // Each row's factor in both words of its dword.
    const __m512i bl = both_words(_mm512_and_si512(sl, m15)), al = both_words(_mm512_srli_epi32(sl, 4));
    const __m512i bh = both_words(_mm512_and_si512(sh, m15)), ah = both_words(_mm512_srli_epi32(sh, 4));
    uint8_t* lo = pieces + 1024 * k;
    uint8_t* hi = pieces + 4096 + 1024 * k;
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const int64_t o = 64 * (8 * k + i);
      const __m512i c = _mm512_loadu_si512(blk + o);
      if constexpr (Prefetch) {
        __builtin_prefetch(blk + kGroupBlock + o, 0, 3);
        __builtin_prefetch(blk + 2 * kGroupBlock + o, 0, 2);
        if (k == 3 && i >= 4) {
          __builtin_prefetch(blk + kGroupBlock + kSide + 64 * (i - 4), 0, 3);
          __builtin_prefetch(blk + 2 * kGroupBlock + kSide + 64 * (i - 4), 0, 2);
        }
      }
      const __m512i wl = _mm512_and_si512(c, m4), wh = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
      _mm512_store_si512(lo + 64 * i, _mm512_mullo_epi16(wl, bl));
      _mm512_store_si512(hi + 64 * i, _mm512_mullo_epi16(wl, al));
      _mm512_store_si512(lo + 512 + 64 * i, _mm512_mullo_epi16(wh, bh));
      _mm512_store_si512(hi + 512 + 64 * i, _mm512_mullo_epi16(wh, ah));
    }
  }
}

// A block's tile products, issued: for two act tiles (rows at a0, a1: their block's codes) into tiles 0-1
// and 2-3, for one (a1 null) into 0-1. One act tile's products are one chain a tile (two chains, even and
// odd chunks, cost their extra tile stores and adds: 0.93-0.95 of the time at 12-16 rows without them).
template <bool Two>
inline void products(const uint8_t* pieces, const uint8_t* a0, const uint8_t* a1, int64_t stride) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (Two) {
    _tile_zero(2);
    _tile_zero(3);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    _tile_loadd(4, pieces + 1024 * k, 64);
    _tile_loadd(5, pieces + 4096 + 1024 * k, 64);
    _tile_loadd(6, a0 + 64 * k, stride);
    _tile_dpbsud(0, 6, 4);
    _tile_dpbsud(1, 6, 5);
    if constexpr (Two) {
      _tile_loadd(7, a1 + 64 * k, stride);
      _tile_dpbsud(2, 7, 4);
      _tile_dpbsud(3, 7, 5);
    }
  }
}

// The sums [act tile][lo, hi][16 rows][16 lanes] of a block's products.
using Sums = int32_t[2][2][16][16];

// The float step of one block for activation rows [0, m) of one act tile (their sums lo, hi), as the
// AVX-512 tiles of the layout take it: acc += (d * da) * isum, acc -= (dmin * da) * msum.
inline void finish(const Side& s, const int32_t (*sums)[16][16], const uint8_t* act, int64_t stride, int64_t b,
                   int m, float (*acc)[16]) {
  __m512i mins[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) mins[j] = s.min_pair(j);
  for (int r = 0; r < m; ++r) {
    const ActK* a = reinterpret_cast<const ActK*>(act + r * stride) + b;
    const __m512i lo = _mm512_load_si512(sums[0][r]), hi = _mm512_load_si512(sums[1][r]);
    const __m512i isum = _mm512_add_epi32(lo, _mm512_slli_epi32(hi, 4));
    __m512i msum = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      msum = _mm512_dpwssd_epi32(msum, mins[j], _mm512_set1_epi32(static_cast<int>(load_u32(
                                     reinterpret_cast<const uint8_t*>(a->bsum32) + 4 * j))));
    const __m512 da = _mm512_set1_ps(a->d);
    __m512 v = _mm512_load_ps(acc[r]);
    v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(s.d, da), _mm512_cvtepi32_ps(isum)));
    v = _mm512_sub_ps(v, _mm512_mul_ps(_mm512_mul_ps(s.dmin, da), _mm512_cvtepi32_ps(msum)));
    _mm512_store_ps(acc[r], v);
  }
}

// The group at g (nb blocks) against activation rows [0, n), n <= kRowsPerCall: acc[r] lane i = weight row
// i . activation row r. Each pair of act tiles makes the pieces of a block as it goes, into two slots that
// stay in L1: a panel of the whole group's pieces, written once for every pair, spilled to L2 and cost more
// than making them again (at 16 rows, the default target's Q4_K weights on 2 Xeon cores: 73 against 64 ms).
// In step b, block b's products are issued, block b + 1's pieces made, block b - 1's float step taken (its
// sums stored in step b - 1), and block b's sums stored: each waits on work two steps old.
// `loaded`: the act tiles' rows of the configuration loaded (loading one costs, and most calls need one).
void group(const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, int n, uint8_t* slots,
           float (*acc)[16], int* loaded) {
  alignas(64) Sums sums[2];
  for (int r = 0; r < n; ++r) _mm512_store_ps(acc[r], _mm512_setzero_ps());
  const int tiles = (n + 15) / 16;
  for (int t = 0; t < tiles; t += 2) {
    const int m0 = std::min(16, n - 16 * t), m1 = t + 1 < tiles ? std::min(16, n - 16 * (t + 1)) : 0;
    if (loaded[0] != m0 || loaded[1] != m1) {
      // Tiles: 0-1 act tile 0's sums lo and hi, 2-3 act tile 1's, 4-5 the weight pieces lo and hi, 6-7
      // the act tiles.
      const int m = m1 > 0 ? m1 : m0;
      const TileConfig config({m0, m0, m, m, 16, 16, m0, m});
      _tile_loadconfig(&config);
      loaded[0] = m0, loaded[1] = m1;
    }
    const uint8_t* a0 = act + 16 * t * stride;
    const uint8_t* a1 = a0 + 16 * stride;
    const auto pieces = [&](const uint8_t* blk, const Side& s, uint8_t* slot) {
      if (t == 0) make_pieces<true>(blk, s, slot);
      else make_pieces<false>(blk, s, slot);  // the group is in cache by now
    };
    Side s(g + kSide), prev = s;  // block b's side data (decoded for its pieces), block b - 1's
    pieces(g, s, slots);
    for (int64_t b = 0; b <= nb; ++b) {
      const Side here = s;
      if (b < nb) {
        const int64_t ab = b * static_cast<int64_t>(sizeof(ActK));
        if (m1 > 0) products<true>(slots + (b & 1) * kPieces, a0 + ab, a1 + ab, stride);
        else products<false>(slots + (b & 1) * kPieces, a0 + ab, nullptr, stride);
        if (b + 1 < nb) {
          const uint8_t* next = g + (b + 1) * kGroupBlock;
          s = Side(next + kSide);
          pieces(next, s, slots + ((b + 1) & 1) * kPieces);
        }
      }
      if (b > 0) {
        const Sums& done = sums[(b - 1) & 1];
        finish(prev, done[0], a0, stride, b - 1, m0, acc + 16 * t);
        if (m1 > 0) finish(prev, done[1], a1, stride, b - 1, m1, acc + 16 * (t + 1));
      }
      if (b < nb) {
        Sums& out = sums[b & 1];
        _tile_stored(0, out[0][0], 64);
        _tile_stored(1, out[0][1], 64);
        if (m1 > 0) {
          _tile_stored(2, out[1][0], 64);
          _tile_stored(3, out[1][1], 64);
        }
        prev = here;
      }
    }
  }
}

}  // namespace

void rows_interleaved(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
                      const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  (void)type;  // Q4_K (takes_interleaved)
  static thread_local std::vector<uint8_t> slot_store;
  uint8_t* slots = scratch(slot_store, static_cast<size_t>(2 * kPieces));
  alignas(64) float acc[kRowsPerCall][16];
  int loaded[2] = {-1, -1};
  for (int64_t g0 = o0 / kGroupRows * kGroupRows; g0 < o1; g0 += kGroupRows) {
    const int64_t lo = std::max(o0, g0), hi = std::min(o1, g0 + kGroupRows);
    const __mmask16 lanes = static_cast<__mmask16>(((1u << (hi - g0)) - 1) & ~((1u << (lo - g0)) - 1));
    for (int64_t c0 = 0; c0 < nrows; c0 += kRowsPerCall) {
      const int n = static_cast<int>(std::min(kRowsPerCall, nrows - c0));
      group(w + g0 * row_bytes, nb, act + c0 * stride, stride, n, slots, acc, loaded);
      for (int r = 0; r < n; ++r) _mm512_mask_storeu_ps(y + (c0 + r) * ldy + g0, lanes, _mm512_load_ps(acc[r]));
    }
  }
  _tile_release();
}

}  // namespace amx
#pragma GCC pop_options
#else
namespace amx {
void rows_interleaved(int64_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t,
                      float*, int64_t) {}
}  // namespace amx
#endif
