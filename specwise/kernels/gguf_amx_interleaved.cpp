// The AMX tiles of the interleaved layout (gguf_interleaved.h) for Q4_K, Q6_K, IQ4_XS and Q8_0: a few to many
// activation rows against 16 weight rows at a time, for the scoring passes of speculative decoding, not only
// prompts.
//
// The layout is already the weight tile AMX reads: a 64-byte run of a group holds 16 rows' dword u, that is
// B's VNNI order (K/4 rows of 16 columns of 4 bytes). Q4_K's chunk k of a block (values 64k .. 64k + 63) is
// the low nibbles of runs 8k .. 8k + 7 (values 64k + 4i ..) then their high nibbles (values 64k + 32 + 4i ..);
// Q6_K's and IQ4_XS's are below. The activation rows are the A tile as they lie (16 rows of 64 bytes, their
// own stride): nothing is packed on the activation side.
//
// The sub-block scales go into the weights, exactly, as two byte pieces lo and hi per value, isum = lo +
// 2^s hi. Q4_K: scale = 16 a + b (a < 4, b < 16), and the pieces b * code (< 226) and a * code (< 46) are
// unsigned bytes, made by one vpmullw each over the codes as words (two codes below 16 a word: their
// products never carry into each other), s = 4. Q6_K: scale * (code - 32) split at bit 8 (Q6K below), s = 8;
// IQ4_XS: scale * value the same way.
// Then per chunk two tile products of the signed activations (TDPBSUD for unsigned pieces, TDPBSSD for
// Q6_K's and IQ4_XS's signed hi) give lo and hi: isum is the exact integer sum over sub-blocks of scale * (codes .
// activations) that the scalar path computes. Q4_K's mins' sum runs in vpdpwssd, and the float step is the
// scalar path's, per block and activation row, lanes = weight rows. So every row's result is bitwise the
// scalar path's, whatever the rows beside it.
//
// Per group block the weight side costs the pieces (Q4_K: 128 vpmullw, Q6_K: 128 vpmaddubsw) and their 8 KB
// of stores, once for every activation row held; each activation row then costs its float step (and Q4_K's
// mins), and its share of 8 tile products.
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

// Rows from which a call of an interleaved weight takes these tiles (fewer: the AVX-512 tiles of the
// layout, whose few rows cost less than the pieces). 2 threads, Intel Xeon, these tiles over the AVX-512
// ones alternated in one process. Q4_K, the default target's fused gate and up projections: 1.09 at 6 rows,
// 0.95 at 8, 0.84 at 9, 0.78 at 12, 0.68 at 16 (30.2 against 44.4 ms). Q6_K, the target's 29 weights of the
// type: 1.13 at 4 rows, 0.97 at 5, 0.90 at 6, 0.82 at 8, 0.55 at 16 (23.8 against 43.3 ms), 0.41 at 32.
// Since the AVX-512 tiles hold up to 8 Q4_K rows and 6 Q6_K rows at once (gguf_avx512_interleaved.cpp):
// Q4_K 1.09 at 8 rows, 0.90 at 9 (the AVX-512 tiles then two of 5 and 4 rows); Q6_K 1.13 at 5 rows, 1.02-1.04
// at 6, 0.86-0.90 at 7 (the output layer and the 28 other weights apart).
constexpr int64_t kMinRowsQ4K = 9, kMinRowsQ6K = 7;

// Q8_0 (run_q8_0 below), against the AVX-512 tiles of up to 12 rows over the re-quantized Q8_0 file's
// weights of the type: 0.93 at 8 and 12 rows, 0.80 at 16, 0.83 at 32.
constexpr int64_t kMinRowsQ8 = 8;

// IQ4_XS (Q6_K's pieces of its looked-up values), against the AVX-512 tiles of up to 8 rows over the
// re-quantized IQ4_XS file's weights of the type: 1.14 at 7 rows, 1.08-1.14 at 8, 0.96 at 9, 0.89 at 10, 0.85 at
// 12, 0.76 at 16 (62.4 against 82.5 ms).
constexpr int64_t kMinRowsIQ4XS = 9;

bool takes_interleaved(int64_t type, int64_t nrows) {
  if (!interleaved(type)) return false;
  if (base_type(type) == kQ6_K) return nrows >= kMinRowsQ6K;
  if (base_type(type) == kQ8_0) return nrows >= kMinRowsQ8;
  if (base_type(type) == kIQ4_XS) return nrows >= kMinRowsIQ4XS;
  return base_type(type) == kQ4_K && nrows >= kMinRowsQ4K;
}

}  // namespace amx

#if SPECWISE_AMX
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "gguf_k_side.h"
namespace amx {
namespace {

constexpr int64_t kPieces = 8 * 1024;  // a block's pieces: 4 chunks of lo, then of hi
constexpr int64_t kRowsPerCall = 64;   // activation rows held at once

// Line `o` of a group block as it is loaded: its twin in the next block to L1, in the one after to L2
// (prefetcht1).
template <int64_t Bytes, bool Prefetch>
inline void paced(const uint8_t* blk, int64_t o) {
  if constexpr (Prefetch) prefetch_matched<Bytes, 2, 2>(blk, o);
}

// Q4_K. Its pieces: chunk k's lo at lo + 1024 k (16 tile rows: the low nibbles' 8, then the high ones'),
// hi likewise, as unsigned bytes b * code and a * code of each sub-block's scale 16 a + b; isum = lo + 16 hi.
struct Q4K {
  static constexpr int64_t kGroupBlock = 16 * 144, kSide = 2048;
  static constexpr bool kSignedHi = false;
  using State = Side;  // the side data, decoded once for the pieces and the float step
  static State state(const uint8_t* blk) { return Side(blk + kSide); }

  template <bool Prefetch>
  static void pieces(const uint8_t* blk, const State& s, uint8_t* out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m15 = _mm512_set1_epi32(15);
    const auto both_words = [](__m512i x) { return _mm512_or_si512(x, _mm512_slli_epi32(x, 16)); };
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i sl = s.get<false>(2 * k), sh = s.get<false>(2 * k + 1);
      // Each row's factor in both words of its dword.
      const __m512i bl = both_words(_mm512_and_si512(sl, m15)), al = both_words(_mm512_srli_epi32(sl, 4));
      const __m512i bh = both_words(_mm512_and_si512(sh, m15)), ah = both_words(_mm512_srli_epi32(sh, 4));
      uint8_t* lo = out + 1024 * k;
      uint8_t* hi = out + 4096 + 1024 * k;
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const int64_t o = 64 * (8 * k + i);
        const __m512i c = _mm512_loadu_si512(blk + o);
        paced<kGroupBlock, Prefetch>(blk, o);
        if (k == 3 && i >= 4) paced<kGroupBlock, Prefetch>(blk, kSide + 64 * (i - 4));  // the side data
        const __m512i wl = _mm512_and_si512(c, m4), wh = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
        _mm512_store_si512(lo + 64 * i, _mm512_mullo_epi16(wl, bl));
        _mm512_store_si512(hi + 64 * i, _mm512_mullo_epi16(wl, al));
        _mm512_store_si512(lo + 512 + 64 * i, _mm512_mullo_epi16(wh, bh));
        _mm512_store_si512(hi + 512 + 64 * i, _mm512_mullo_epi16(wh, ah));
      }
    }
  }

  // The float step of one block for activation rows [0, m) of one act tile, as the AVX-512 tiles of the
  // layout take it: acc += (d * da) * isum, acc -= (dmin * da) * msum.
  static void finish(const State& s, const int32_t (*sums)[16][16], const uint8_t* act, int64_t stride, int64_t b,
                     int m, float (*acc)[16]) {
    __m512i mins[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) mins[j] = s.min_pair(j);
    for (int r = 0; r < m; ++r) {
      const ActK* a = reinterpret_cast<const ActK*>(act + r * stride) + b;
      const __m512i isum = _mm512_add_epi32(_mm512_load_si512(sums[0][r]), _mm512_slli_epi32(_mm512_load_si512(sums[1][r]), 4));
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
};

// Q6_K: chunk (h, l) of a block (Q6Chunk, gguf_k_side.h) gives, per j, 16 rows' values 128 h + 32 j + l ..
// + 3 (sub-block 8 h + 2 j + l / 16): a VNNI row of the weight tile. Tile chunk c = 2 h + j / 2 (values
// 64 c .. 64 c + 63, the activations' bytes as they lie) takes j's 8 such rows, then j + 1's.
// Its pieces: P = scale * (code - 32), in [-4096, 4064], as P = 256 hi + lo, lo = P & 255 unsigned and
// hi = P >> 8 signed ([-16, 15]); isum = lo + 256 hi. Each register's even and odd codes are multiplied by
// the int8 scale in one vpmaddubsw each (the other byte of the pair zero), 32 * scale taken off, and the
// words' bytes put back in place with one vpternlogd for lo, one for hi.
// The types whose pieces carry every sub-block scale (Q6_K, IQ4_XS), P = 256 hi + lo with hi signed: their
// float step, as the AVX-512 tiles of the layout take it, is acc += (d * da) * isum, d the group block's 16
// fp16 at D.
template <int64_t D>
struct ScaledPieces {
  static constexpr bool kSignedHi = true;
  struct State {
    __m512 d;
  };
  static State state(const uint8_t* blk) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + D)))};
  }

  static void finish(const State& s, const int32_t (*sums)[16][16], const uint8_t* act, int64_t stride, int64_t b,
                     int m, float (*acc)[16]) {
    for (int r = 0; r < m; ++r) {
      const ActK* a = reinterpret_cast<const ActK*>(act + r * stride) + b;
      const __m512i isum = _mm512_add_epi32(_mm512_load_si512(sums[0][r]), _mm512_slli_epi32(_mm512_load_si512(sums[1][r]), 8));
      const __m512 v = _mm512_load_ps(acc[r]);
      _mm512_store_ps(acc[r], _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(s.d, _mm512_set1_ps(a->d)), _mm512_cvtepi32_ps(isum))));
    }
  }

  // A register of 16 rows' 4 unsigned codes u (lanes = rows) times their row's scale, less offset * scale:
  // `even` and `odd` hold the int8 scale in the even (odd) byte of each word, `off` offset * scale a word.
  // Its lo and hi pieces go to out + row and out + 4096 + row.
  static void store(__m512i u, __m512i even, __m512i odd, __m512i off, uint8_t* out, int64_t row) {
    const __m512i low = _mm512_set1_epi16(0x00FF);
    const __m512i pe = _mm512_sub_epi16(_mm512_maddubs_epi16(u, even), off);
    const __m512i po = _mm512_sub_epi16(_mm512_maddubs_epi16(u, odd), off);
    // lo: pe's low byte, po's low byte above it; hi: their high bytes (0xE4: a where c, else b).
    _mm512_store_si512(out + row, _mm512_ternarylogic_epi32(pe, _mm512_slli_epi16(po, 8), low, 0xE4));
    _mm512_store_si512(out + 4096 + row, _mm512_ternarylogic_epi32(_mm512_srli_epi16(pe, 8), po, low, 0xE4));
  }
};

struct Q6K : ScaledPieces<kQ6D> {
  static constexpr int64_t kGroupBlock = 16 * 210, kScales = kQ6Scales, kD = kQ6D;

  template <bool Prefetch>
  static void pieces(const uint8_t* blk, const State&, uint8_t* out) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
      for (int u = 0; u < 2; ++u) {
        // Sub-block 8 h + 2 j + u's scale: even (odd) bytes of each row's words, and 32 * scale a word.
        __m512i even[4], odd[4], off[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kScales + 16 * (8 * h + 2 * j + u)));
          const __m512i z = _mm512_cvtepu8_epi32(sc), x = _mm512_cvtepi8_epi32(sc);
          even[j] = _mm512_or_si512(z, _mm512_slli_epi32(z, 16));
          odd[j] = _mm512_slli_epi32(even[j], 8);
          off[j] = _mm512_slli_epi16(_mm512_or_si512(_mm512_and_si512(x, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(x, 16)), 5);
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const Q6Chunk chunk(h, 16 * u + 4 * i);
          const __m512i ql0 = _mm512_loadu_si512(blk + chunk.ql0), ql1 = _mm512_loadu_si512(blk + chunk.ql1);
          const __m512i qh = _mm512_loadu_si512(blk + chunk.qh);
          paced<kGroupBlock, Prefetch>(blk, chunk.ql0);
          paced<kGroupBlock, Prefetch>(blk, chunk.ql1);
          paced<kGroupBlock, Prefetch>(blk, chunk.qh);
          if (h == 1 && u == 1) {  // the scales and d with the last code loads
            paced<kGroupBlock, Prefetch>(blk, kScales + 64 * i);
            if (i == 3) paced<kGroupBlock, Prefetch>(blk, kD);
          }
          __m512i w[4];
          Q6Chunk::codes(ql0, ql1, qh, w);
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j)
            store(w[j], even[j], odd[j], off[j], out, 1024 * (2 * h + j / 2) + 64 * (8 * (j % 2) + 4 * u + i));
        }
      }
    }
  }

};

// IQ4_XS: sub-block j's codes are runs 4 j .. 4 j + 3 (gguf_avx512_interleaved.cpp, IQ4XS), run 4 j + c's low
// nibbles values 32 j + 4 c .. + 3 of the 16 rows and its high nibbles values 32 j + 16 + 4 c .. + 3: VNNI rows
// 8 (j % 2) + c and 8 (j % 2) + 4 + c of tile chunk j / 2. Its pieces are Q6_K's, P = scale * value (the 6-bit
// signed scale in [-32, 31], the looked-up value in [-127, 113]) in [-4064, 4064]: the value looked up as
// unsigned (+128) meets the scale in vpmaddubsw, and 128 * scale comes off in words.
struct IQ4XS : ScaledPieces<kIQ4D> {
  static constexpr int64_t kGroupBlock = kGroupRows * block_bytes(kIQ4_XS);

  template <bool Prefetch>
  static void pieces(const uint8_t* blk, const State&, uint8_t* out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), table = IQ4Side::unsigned_table();
    const IQ4Side side(blk);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i scale = side.scale(j);
      const __m512i z = _mm512_and_si512(scale, _mm512_set1_epi32(0xFF));
      const __m512i even = _mm512_or_si512(z, _mm512_slli_epi32(z, 16)), odd = _mm512_slli_epi32(even, 8);
      const __m512i off = _mm512_slli_epi16(
          _mm512_or_si512(_mm512_and_si512(scale, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(scale, 16)), 7);
      uint8_t* chunk = out + 1024 * (j / 2) + 512 * (j % 2);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const int64_t o = 64 * (4 * j + c);
        const __m512i raw = _mm512_loadu_si512(blk + o);
        paced<kGroupBlock, Prefetch>(blk, o);
        if (j == 7 && c >= 2) paced<kGroupBlock, Prefetch>(blk, kIQ4D + 64 * (c - 2));  // the side data's 2 lines
        store(_mm512_shuffle_epi8(table, _mm512_and_si512(raw, m4)), even, odd, off, chunk, 64 * c);
        store(_mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4)), even, odd, off, chunk,
              64 * (4 + c));
      }
    }
  }
};

// A block's tile products, issued: for two act tiles (rows at a0, a1: their block's codes) into tiles 0-1
// and 2-3, for one (a1 null) into 0-1. One act tile's products are one chain a tile (two chains, even and
// odd chunks, cost their extra tile stores and adds: 0.93-0.95 of the time at 12-16 rows without them).
// Signed activations times the unsigned lo pieces (TDPBSUD) and the hi ones (Q6_K's signed: TDPBSSD).
template <class K, bool Two>
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
    if constexpr (K::kSignedHi) _tile_dpbssd(1, 6, 5);
    else _tile_dpbsud(1, 6, 5);
    if constexpr (Two) {
      _tile_loadd(7, a1 + 64 * k, stride);
      _tile_dpbsud(2, 7, 4);
      if constexpr (K::kSignedHi) _tile_dpbssd(3, 7, 5);
      else _tile_dpbsud(3, 7, 5);
    }
  }
}

// The lanes (weight rows g0 + i) of the group at g0 that fall in the call's rows [o0, o1).
inline __mmask16 group_lanes(int64_t o0, int64_t o1, int64_t g0) {
  const int64_t lo = std::max(o0, g0), hi = std::min(o1, g0 + kGroupRows);
  return static_cast<__mmask16>(((1u << (hi - g0)) - 1) & ~((1u << (lo - g0)) - 1));
}

// The sums [act tile][lo, hi][16 rows][16 lanes] of a block's products.
using Sums = int32_t[2][2][16][16];

// The group at g (nb blocks) against activation rows [0, n), n <= kRowsPerCall: acc[r] lane i = weight row
// i . activation row r. Each pair of act tiles makes the pieces of a block as it goes, into two slots that
// stay in L1: a panel of the whole group's pieces, written once for every pair, spilled to L2 and cost more
// than making them again (at 16 rows, the default target's Q4_K weights on 2 Xeon cores: 73 against 64 ms).
// In step b, block b's products are issued, block b + 1's pieces made, block b - 1's float step taken (its
// sums stored in step b - 1), and block b's sums stored: each waits on work a step old.
// Prefetch: the first pair of act tiles reads the group from memory, each line's prefetches paced by its load
// (paced above). The pieces' stores and the float steps leave the loads few slots; a burst of the next
// blocks' lines at each block's start (16 KiB ahead into L2) left the stream behind: at 16 rows, the default
// target's Q4_K gate and up projections on 2 Xeon cores, 0.87-0.89 of that time.
// `loaded`: the act tiles' rows of the configuration loaded (loading one costs, and most calls need one).
template <class K>
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
      load_tile_config(config);
      loaded[0] = m0, loaded[1] = m1;
    }
    const uint8_t* a0 = act + 16 * t * stride;
    const uint8_t* a1 = a0 + 16 * stride;
    const auto pieces = [&](const uint8_t* blk, const typename K::State& s, uint8_t* slot) {
      if (t == 0) K::template pieces<true>(blk, s, slot);
      else K::template pieces<false>(blk, s, slot);  // the group is in cache by now
    };
    typename K::State s = K::state(g), prev = s;  // block b's side data, block b - 1's
    pieces(g, s, slots);
    for (int64_t b = 0; b <= nb; ++b) {
      const typename K::State here = s;
      if (b < nb) {
        const int64_t ab = b * static_cast<int64_t>(sizeof(ActK));
        if (m1 > 0) products<K, true>(slots + (b & 1) * kPieces, a0 + ab, a1 + ab, stride);
        else products<K, false>(slots + (b & 1) * kPieces, a0 + ab, nullptr, stride);
        if (b + 1 < nb) {
          const uint8_t* next = g + (b + 1) * K::kGroupBlock;
          s = K::state(next);
          pieces(next, s, slots + ((b + 1) & 1) * kPieces);
        }
      }
      if (b > 0) {
        const Sums& done = sums[(b - 1) & 1];
        K::finish(prev, done[0], a0, stride, b - 1, m0, acc + 16 * t);
        if (m1 > 0) K::finish(prev, done[1], a1, stride, b - 1, m1, acc + 16 * (t + 1));
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

template <class K>
void run(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
         int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  static thread_local std::vector<uint8_t> slot_store;
  uint8_t* slots = scratch(slot_store, static_cast<size_t>(2 * kPieces));
  alignas(64) float acc[kRowsPerCall][16];
  int loaded[2] = {-1, -1};
  for (int64_t g0 = o0 / kGroupRows * kGroupRows; g0 < o1; g0 += kGroupRows) {
    const __mmask16 lanes = group_lanes(o0, o1, g0);
    for (int64_t c0 = 0; c0 < nrows; c0 += kRowsPerCall) {
      const int n = static_cast<int>(std::min(kRowsPerCall, nrows - c0));
      group<K>(w + g0 * row_bytes, nb, act + c0 * stride, stride, n, slots, acc, loaded);
      for (int r = 0; r < n; ++r) _mm512_mask_storeu_ps(y + (c0 + r) * ldy + g0, lanes, _mm512_load_ps(acc[r]));
    }
  }
  _tile_release();
}

// Q8_0: a block of a group is 8 runs of 64 bytes, run k holding values 4 k .. 4 k + 3 of the 16 rows
// (gguf_avx512_interleaved.cpp, Blocks32): the weight tile of one block (K = 32, signed) in VNNI order as it
// lies. One tile product a block gives each activation row's and weight row's integer sum, and the float
// step is the AVX-512 tiles' (d_w * d_a) * isum added in block order: bitwise the scalar path's. Each
// block's sums are stored (two tiles in turn) and its float step taken a block later, while the next
// product runs. (Q4_0 the same way, its codes unpacked into 512 bytes a block first, took 0.93-1.10 of the
// AVX-512 tiles' time at 8-32 rows and was not kept.)
void run_q8_0(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
              int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  // A group block and its d (gguf_interleaved.h's layout); prefetches as far ahead as the AVX-512 tiles'.
  constexpr int64_t kBlock = kGroupRows * block_bytes(kQ8_0), kD = field_offset(kQ8_0, 1), kFar = 4608 / kBlock;
  alignas(64) int32_t sums[2][16][16];
  int loaded = -1;
  for (int64_t g0 = o0 / kGroupRows * kGroupRows; g0 < o1; g0 += kGroupRows) {
    const __mmask16 lanes = group_lanes(o0, o1, g0);
    const uint8_t* g = w + g0 * row_bytes;
    for (int64_t r0 = 0; r0 < nrows; r0 += 16) {
      const int m = static_cast<int>(std::min<int64_t>(16, nrows - r0));
      if (loaded != m) {  // tiles 0-1 the sums in turn, 2 the activation rows (32 bytes), 3 the weights
        TileConfig config({m, m, m, 8});
        config.colsb[2] = 32;
        load_tile_config(config);
        loaded = m;
      }
      const uint8_t* a0 = act + r0 * stride;
      __m512 acc[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
      const auto step = [&](int64_t b) {  // block b's float step, its sums stored
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + b * kBlock + kD)));
        const int h = static_cast<int>(b & 1);
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r) {
          if (r >= m) break;
          const Act32* a = reinterpret_cast<const Act32*>(a0 + r * stride) + b / 2;
          acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(a->d[8 * h])),
                                                       _mm512_cvtepi32_ps(_mm512_load_si512(sums[h][r]))));
        }
      };
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = g + b * kBlock;
        if (r0 == 0) for (int64_t o = 0; o < kBlock; o += 64) prefetch_matched<kBlock, kFar, 2>(blk, o);
        _tile_loadd(2, a0 + (b / 2) * static_cast<int64_t>(sizeof(Act32)) + 32 * (b & 1), stride);
        _tile_loadd(3, blk, 64);
        if (b & 1) {
          _tile_zero(1);
          _tile_dpbssd(1, 2, 3);
        } else {
          _tile_zero(0);
          _tile_dpbssd(0, 2, 3);
        }
        if (b > 0) step(b - 1);
        if (b & 1) _tile_stored(1, sums[1], 64);
        else _tile_stored(0, sums[0], 64);
      }
      step(nb - 1);
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) if (r < m) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + g0, lanes, acc[r]);
    }
  }
  _tile_release();
}

}  // namespace

void rows_interleaved(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
                      const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (base_type(type)) {
    case kQ6_K: run<Q6K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kIQ4_XS: run<IQ4XS>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ8_0: run_q8_0(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    default: run<Q4K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;  // Q4_K (takes_interleaved)
  }
}

}  // namespace amx
#pragma GCC pop_options
#else
namespace amx {
void rows_interleaved(int64_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t,
                      float*, int64_t) {}
}  // namespace amx
#endif
