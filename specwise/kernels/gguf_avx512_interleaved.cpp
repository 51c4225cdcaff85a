// The AVX-512 tiles of the interleaved layout (gguf_interleaved.h), in groups of 16 output rows, lanes = rows:
// Q4_K (and Q5_K), Q6_K, IQ4_XS, and the 32-value Q8_0, Q4_0, Q5_0. Per block and group the codes are unpacked
// once (Q4_K: a load, an and, a shift, an and per 64 codes) and the scales, mins and d decoded once into 16
// lanes; each activation row then costs its vpdpbusd (a broadcast dword of its codes against 16 rows' 4
// codes: 64 a 256-value block, 8 a 32-value one), a vpmulld and an add per sub-block for the scales, a few
// vpdpwssd for the mins (Q4_K) or the offset (Q6_K) against its sub-block sums, and the block's float step:
// no horizontal sum, nothing per (row, block) that the format asks again. The block's sums are the exact
// integers the scalar path computes and the float step is its own, so every lane is bitwise the scalar
// path's row (gguf_scalar.cpp), whatever the rows beside it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gguf_activations.h"
#include "gguf_interleaved.h"
#include "gguf_paths.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "gguf_k_side.h"
namespace avx512 {
namespace {

constexpr int kMaxRows = 4;  // activation rows a tile holds on AMD builds (each kind's kRows: on Intel ones)

// acc + w . (the 4 activation bytes at p, in every lane): one vpdpbusd with the broadcast in its memory
// operand. For _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(...)) GCC emits a vpbroadcastd of its own,
// an instruction per product that made the few-row tiles 1.3-1.5x slower (Zen 4, one core).
inline __m512i dot4(__m512i acc, __m512i w, const uint8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// The group block kAhead bytes past blk into L2 (prefetcht1), a line at a time. The groups of a weight lie
// one after the other, so this runs ahead of the stream across groups too. Without it the tiles stalled on
// their first loads of a block (the hardware prefetchers did not keep up with the codes, scales and side
// data read in turn): on one Zen 4 core, 16 KiB ahead took Q6_K's one-row tile from 9.7-11.4 ms to 2.9-4.1
// over 90 MB and Q4_K's five-row tile from 7.7 to 3.9-4.1 (scripts/lab/interleave_ab.py has the whole pass).
// On Intel CPUs (SPECWISE_FAR_PREFETCH, gguf_blocks.h) the stored tiles' distances do better: the next group
// block into L1 and the fourth one ahead into L2, for every tile, one Q4_K row included. Q4_K, Q6_K and
// IQ4_XS issue them paced by their loads (prefetch_matched): each code line's twins as the line is loaded,
// the side data's at the block's start. On 2 cores of a Xeon with AMX, alternated in one process, the whole
// block at its start instead took 1.16-1.28x the time for Q4_K at 1-8 rows, 1.14-1.25x for Q6_K and
// 1.06-1.20x for IQ4_XS at 1-16, and the same prefetches spread evenly ahead of the loads 1.08-1.23x (Q4_K):
// bursts keep the line fill buffers from the loads. The L2 distance of Q4_K, IQ4_XS and the 32-value types, and
// Q4_K's one-row order, are below.
constexpr int64_t kAhead = 16384;
// Q4_K, IQ4_XS and the 32-value types prefetch into L2 (prefetcht1) about kFarBytes ahead, whatever their
// group block's size: two blocks of Q4_K or IQ4_XS, 8 of Q8_0, 13 of Q5_0, 16 of Q4_0. On 2 cores of a Xeon
// with AMX, alternated in one process over each file's weights of the type, against the fourth block on
// into L2 alone (prefetcht2): Q4_K 0.94-0.96 of the time at 1 row (the target's gate and up projection),
// IQ4_XS 0.96-0.98 at 1-8 rows, Q8_0 0.94-0.99, Q4_0 0.83-0.85 at 1-4 rows and 0.97 at 8. Q5_K keeps the
// fourth block; Q6_K goes two blocks ahead with its prefetches in the lines' order (Q6K below).
constexpr int64_t kFarBytes = 4608;
constexpr int kFarHint = 2;  // prefetcht1
template <int64_t Bytes, int Far = 4, int Hint = 1>
inline void prefetch_l2(const uint8_t* blk) {
  for (int64_t o = 0; o < Bytes; o += 64) {
    if constexpr (kFarPrefetch) prefetch_matched<Bytes, Far, Hint>(blk, o);
    else __builtin_prefetch(blk + kAhead + o, 0, 2);
  }
}

// Q4_K (Five: Q5_K, whose fifth bits are set into the unpacked codes: bit 2 k of qh byte l for the low
// nibbles of chunk (k, i), l = 4 i + t, bit 2 k + 1 for the high ones; gguf_blocks.h, q5k).
template <bool Five>
struct Q4K {
static constexpr int64_t kGroupBlock = 16 * (Five ? 176 : 144), kSide = Five ? 2560 : 2048;
// Rows a tile holds: up to 8 Q4_K rows on Intel builds (below), Q5_K's and AMD builds' 4.
static constexpr int kRows = kFarPrefetch && !Five ? 8 : kMaxRows;

// Intel CPUs: the code lines' prefetches as they are loaded, the lines past the codes' (Q5_K's fifth bits, the
// side data) at the block's start, or for one Q4_K row with its last code loads: one row leaves the least
// time between loads, and a burst at the start then kept the fill buffers from them. The L2 ones kFarBytes
// ahead (above). Both against four blocks ahead into L2 alone, with the side data at the start, on 2 cores
// of a Xeon with AMX, alternated in one process over the target's fused gate and up projections: 0.94-0.96
// of the time at 1 row, 0.97-0.99 at 2-4.
static constexpr int kFar = Five ? 4 : kFarBytes / kGroupBlock, kHint = Five ? 1 : kFarHint;  // 2 blocks
template <int MB>
static constexpr bool kSideLate = !Five && MB == 1;
static void side_prefetch(const uint8_t* blk) {
  for (int64_t o = 2048; o < kGroupBlock; o += 64) prefetch_matched<kGroupBlock, kFar, kHint>(blk, o);
}

// MB activation rows against blocks [b0, b1) of one group (at g): out[16 m + r] += row m . weight row r; the
// running sums wait in `out` between blocks. From 3 rows on, a block's 8 scales and 4 min pairs are decoded into L1
// first and read as memory operands; for 1-2 rows they stay in registers (staging cost a tenth more there).
// On AMD builds tiles of 5-8 rows ran slower than two tiles of half as many (scripts/lab/interleave_ab.py, an
// earlier version of this tile); on 2 Xeon cores this one holds up to 8 (kRows): alternated in one process over
// the target's Q4_K weights, 0.81-0.86 of the stored tiles' time at 5-16 rows (one tile to 8 rows, two to 16)
// against 0.89-0.95 with tiles of up to 4.
// Q4_K's high nibbles stay where they are (c & 0xF0: 16 times the code) and each sub-block's sum of them is
// shifted down by 4 before its scale multiplies it, which is exact (every product is a multiple of 16, and
// |sum| <= 32 * 240 * 128 < 2^31): one shift per sub-block and row instead of one per code register. At one
// row that took 0.92-0.93 of the time, at 2-4 rows 0.90-0.92 (the same alternation as above). Q5_K sets its
// fifth bits above the high nibbles, where a byte has no room left, and keeps the shifted codes.
template <int MB>
static void tile(const uint8_t* g, int64_t b0, int64_t b1, const uint8_t* act, int64_t stride, float* out) {
  constexpr bool kStaged = MB > 2;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  alignas(64) __m512i staged[kStaged ? 12 : 1];
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blk = g + b * kGroupBlock;
    if constexpr (kFarPrefetch) {
      if constexpr (!kSideLate<MB>) side_prefetch(blk);
    } else if constexpr (Five || MB > 1) {
      prefetch_l2<kGroupBlock>(blk);  // one Q4_K row on AMD: the hardware's keeps up
    }
    const Side s(blk + kSide);
    if constexpr (kStaged) {
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) _mm512_store_si512(staged + t, s.get<false>(t));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) _mm512_store_si512(staged + 8 + j, s.min_pair(j));
    }
    const auto scale = [&](int t) { return kStaged ? _mm512_load_si512(staged + t) : s.get<false>(t); };
    const auto min_pair = [&](int j) { return kStaged ? _mm512_load_si512(staged + 8 + j) : s.min_pair(j); };
    const ActK* a[MB];
    __m512i isum[MB];
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      a[m] = reinterpret_cast<const ActK*>(act + m * stride) + b;
      isum[m] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m512i lo[MB], hi[MB];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) lo[m] = hi[m] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m512i c = _mm512_loadu_si512(blk + 64 * (8 * k + i));
        if constexpr (kFarPrefetch) {
          prefetch_matched<kGroupBlock, kFar, kHint>(blk, 64 * (8 * k + i));
          // One Q4_K row: the 4 side lines with the last 4 code loads.
          if constexpr (kSideLate<MB>) if (k == 3 && i >= 4) prefetch_matched<kGroupBlock, kFar, kHint>(blk, kSide + 64 * (i - 4));
        }
        // Q4_K: the high nibbles times 16 (above).
        __m512i wl = _mm512_and_si512(c, m4),
                wh = Five ? _mm512_and_si512(_mm512_srli_epi16(c, 4), m4) : _mm512_andnot_si512(m4, c);
        if constexpr (Five) {
          const __m512i h = _mm512_loadu_si512(blk + 2048 + 64 * i), bit = _mm512_set1_epi8(0x10);
          wl = _mm512_or_si512(wl, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h, _mm512_set1_epi8(1 << (2 * k))), bit));
          wh = _mm512_or_si512(wh, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h, _mm512_set1_epi8(2 << (2 * k))), bit));
        }
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
          const uint8_t* q = reinterpret_cast<const uint8_t*>(a[m]->q) + 64 * k + 4 * i;
          lo[m] = dot4(lo[m], wl, q);
          hi[m] = dot4(hi[m], wh, q + 32);
        }
      }
      if constexpr (!Five) {
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) hi[m] = _mm512_srai_epi32(hi[m], 4);
      }
      const __m512i scale_lo = scale(2 * k), scale_hi = scale(2 * k + 1);
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(lo[m], scale_lo));
        isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(hi[m], scale_hi));
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      __m512i msum = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j)
        msum = _mm512_dpwssd_epi32(msum, min_pair(j), _mm512_set1_epi32(static_cast<int>(load_u32(
                                       reinterpret_cast<const uint8_t*>(a[m]->bsum32) + 4 * j))));
      const __m512 da = _mm512_set1_ps(a[m]->d);
      __m512 acc = _mm512_loadu_ps(out + 16 * m);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(s.d, da), _mm512_cvtepi32_ps(isum[m])));
      acc = _mm512_sub_ps(acc, _mm512_mul_ps(_mm512_mul_ps(s.dmin, da), _mm512_cvtepi32_ps(msum)));
      _mm512_storeu_ps(out + 16 * m, acc);
    }
  }
}
};

// Q6_K: value 128 h + 32 j + l (j < 4, l < 32) is the low (j < 2) or high nibble of ql byte 64 h + 32 (j & 1) + l
// with bits 2 j, 2 j + 1 of qh byte 32 h + l above it, in sub-block 8 h + 2 j + l / 16 (gguf_blocks.h,
// q6k_value). Per sub-block (4 chunks of 4 values) a row's integer sum of codes times activations is
// multiplied by the sub-block's int8 scale (vpmulld) and summed, the offset 32 * sum_g scale_g * bsum16_g
// taken off by 8 vpdpwssd: the block's sum is the exact integer the scalar path computes (|sum| < 2^31),
// and the float step is the scalar path's, (d * da) * sum, so every lane is bitwise the scalar path's row.
struct Q6K {
static constexpr int64_t kGroupBlock = 16 * 210, kScales = kQ6Scales, kD = kQ6D;
// Intel CPUs: the prefetches go through the block's lines in order, three with each chunk's three loads
// (which take a line of each of ql's halves and one of qh), the twins kFarBytes ahead (prefetcht1, two
// blocks); for 1-2 rows the side data's with the last chunks' loads, as Q4_K's one row. Against the loads'
// own lines, four blocks ahead (prefetcht2) and the side data at the block's start, on 2 Xeon cores
// alternated in one process: the output layer (151936 rows) 0.97 of the time at 1-2 rows, where the
// stored tiles stream faster (1.02 of theirs, was 1.05), the down projections' 0.96-0.99.
static constexpr int kFar = 2, kHint = kFarHint;

// Up to 6 rows a tile on Intel builds (Q4K's kRows): from 5 rows the float sums stay in `out` (a load and a
// store a row and block), so that the 4 chunk sums and the integer total of each row fit in the registers
// beside the codes.
static constexpr int kRows = kFarPrefetch ? 6 : kMaxRows;
template <int MB>
static void tile(const uint8_t* g, int64_t b0, int64_t b1, const uint8_t* act, int64_t stride, float* out) {
  constexpr bool kHeld = MB <= 4;
  __m512 acc[kHeld ? MB : 1];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) if constexpr (kHeld) acc[m] = _mm512_loadu_ps(out + 16 * m);
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blk = g + b * kGroupBlock;
    if constexpr (kFarPrefetch) {  // the scales and d (for 1-2 rows, with the last loads below)
      if constexpr (MB > 2) for (int64_t o = kScales; o < kGroupBlock; o += 64) prefetch_matched<kGroupBlock, kFar, kHint>(blk, o);
    } else {
      prefetch_l2<kGroupBlock>(blk);
    }
    const ActK* a[MB];
    __m512i total[MB];
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      a[m] = reinterpret_cast<const ActK*>(act + m * stride) + b;
      total[m] = _mm512_setzero_si512();
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
      for (int u = 0; u < 2; ++u) {
        // Sub-blocks 8 h + 2 j + u, j < 4: chunk i's three loads (ql for j even and odd, qh) give all four
        // j's registers (Q6Chunk, gguf_k_side.h).
        __m512i sum[MB][4];
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m)
          for (int j = 0; j < 4; ++j) sum[m][j] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const Q6Chunk chunk(h, 16 * u + 4 * i);
          const __m512i ql0 = _mm512_loadu_si512(blk + chunk.ql0);
          const __m512i ql1 = _mm512_loadu_si512(blk + chunk.ql1);
          const __m512i qh = _mm512_loadu_si512(blk + chunk.qh);
          if constexpr (kFarPrefetch) {
            const int64_t line = 3 * 64 * (8 * h + 4 * u + i);  // lines 0 .. 47 in order, 3 a chunk
            prefetch_matched<kGroupBlock, kFar, kHint>(blk, line);
            prefetch_matched<kGroupBlock, kFar, kHint>(blk, line + 64);
            prefetch_matched<kGroupBlock, kFar, kHint>(blk, line + 128);
            if (MB <= 2 && h == 1 && u == 1) {  // the scales' 4 lines and d's
              prefetch_matched<kGroupBlock, kFar, kHint>(blk, kScales + 64 * i);
              if (i == 3) prefetch_matched<kGroupBlock, kFar, kHint>(blk, kD);
            }
          }
          __m512i w[4];
          Q6Chunk::codes(ql0, ql1, qh, w);
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m) {
            const uint8_t* q = reinterpret_cast<const uint8_t*>(a[m]->q) + 128 * h + 16 * u + 4 * i;
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) sum[m][j] = dot4(sum[m][j], w[j], q + 32 * j);
          }
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const int s = 8 * h + 2 * j + u;
          const __m512i scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kScales + 16 * s)));
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m) total[m] = _mm512_add_epi32(total[m], _mm512_mullo_epi32(sum[m][j], scale));
        }
      }
    }
    // The offset of 32: sum_g scale_g * bsum16_g over word pairs of scales (g = 2 p, 2 p + 1).
    __m512i pairs[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {
      const __m512i even = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kScales + 32 * p)));
      const __m512i odd = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kScales + 32 * p + 16)));
      pairs[p] = _mm512_or_si512(_mm512_and_si512(even, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(odd, 16));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kD)));
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const uint8_t* bs = reinterpret_cast<const uint8_t*>(a[m]->bsum16);
      __m512i offset = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p)
        offset = _mm512_dpwssd_epi32(offset, pairs[p], _mm512_set1_epi32(static_cast<int>(load_u32(bs + 4 * p))));
      const __m512i isum = _mm512_sub_epi32(total[m], _mm512_slli_epi32(offset, 5));
      const __m512 step = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(a[m]->d)), _mm512_cvtepi32_ps(isum));
      if constexpr (kHeld) acc[m] = _mm512_add_ps(acc[m], step);
      else _mm512_storeu_ps(out + 16 * m, _mm512_add_ps(_mm512_loadu_ps(out + 16 * m), step));
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) if constexpr (kHeld) _mm512_storeu_ps(out + 16 * m, acc[m]);
}
};

// IQ4_XS: sub-block j's 16 code bytes are runs 4 j .. 4 j + 3 (low nibbles: values 32 j + 4 c .. + 3 of run
// 4 j + c, high nibbles the same places + 16), looked up in kIQ4Values and moved to unsigned (+128); the
// offset 128 * bsum32[j] is taken off each sub-block's sum before its 6-bit signed scale multiplies it.
struct IQ4XS {
static constexpr int64_t kGroupBlock = 16 * 136;
// Up to 8 rows a tile on Intel builds (8 code registers, 2 sums a row). On 2 Xeon cores over the re-quantized
// IQ4_XS file's weights of the type: against tiles of up to 4, alternated in one process, 0.86-0.94 of the
// time at 5, 6, 12 and 16 rows with tiles of up to 6; up to 8 then took 0.91 of the 6-row tiles' time at 8
// rows and 0.89 at 16 (scripts/lab/interleave_ab.py, the ratio to the stored tiles on each build).
static constexpr int kRows = kFarPrefetch ? 8 : kMaxRows;
static constexpr int kFar = kFarBytes / kGroupBlock;  // 2

template <int MB>
static void tile(const uint8_t* g, int64_t b0, int64_t b1, const uint8_t* act, int64_t stride, float* out) {
  // The table moved to unsigned once, not each looked-up register.
  const __m512i m4 = _mm512_set1_epi8(0x0F), table = IQ4Side::unsigned_table();
  __m512 acc[MB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_loadu_ps(out + 16 * m);
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blk = g + b * kGroupBlock;
    if constexpr (kFarPrefetch) {  // d and the scales; the code lines' as they are loaded
      for (int64_t o = kIQ4D; o < kGroupBlock; o += 64) prefetch_matched<kGroupBlock, kFar, kFarHint>(blk, o);
    } else {
      prefetch_l2<kGroupBlock>(blk);
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kIQ4D)));
    const IQ4Side side(blk);
    const ActK* a[MB];
    __m512i isum[MB];
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      a[m] = reinterpret_cast<const ActK*>(act + m * stride) + b;
      isum[m] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i scale = side.scale(j);
      __m512i wl[4], wh[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i raw = _mm512_loadu_si512(blk + 64 * (4 * j + c));
        if constexpr (kFarPrefetch) prefetch_matched<kGroupBlock, kFar, kFarHint>(blk, 64 * (4 * j + c));
        wl[c] = _mm512_shuffle_epi8(table, _mm512_and_si512(raw, m4));
        wh[c] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
      }
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        const uint8_t* q = reinterpret_cast<const uint8_t*>(a[m]->q) + 32 * j;
        __m512i s = _mm512_set1_epi32(-128 * a[m]->bsum32[j]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          s = dot4(s, wl[c], q + 4 * c);
          s = dot4(s, wh[c], q + 16 + 4 * c);
        }
        isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(s, scale));
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m)
      acc[m] = _mm512_add_ps(acc[m], _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(a[m]->d)), _mm512_cvtepi32_ps(isum[m])));
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}
};

// The 32-value types with signed weights (Q8_0, Q4_0, Q5_0): eight registers of 16 rows' 4 values a block,
// unsigned (Q8_0: v + 128; Q4_0 and Q5_0: their codes), their offset taken off by the activations' corr
// (Act32: -offset * the block's sum; Q4_0 reads 128's as 8's). Register k holds values 4 k .. 4 k + 3 (for
// Q4_0 and Q5_0: run k's low nibbles for k < 4, run k - 4's high nibbles, values 16 + 4 (k - 4), for k >= 4).
template <int64_t Type>
struct Blocks32 {
// A group block and where its d starts: the layout's last field (gguf_interleaved.h).
static constexpr int64_t kGroupBlock = kGroupRows * block_bytes(Type), kD = field_offset(Type, fields(Type).n - 1);
// Up to 16 rows a tile on Intel builds: a row holds only its float sums beside the block's 8 code registers.
// On 2 Xeon cores over the re-quantized files' weights of the type, against tiles of up to 4, alternated in
// one process: Q4_0 0.83-0.88 of the time at 5-16 rows, Q8_0 0.91-0.97, with tiles of up to 12; 16 rows in
// one tile then took 0.88 of two tiles' time for Q4_0 (scripts/lab/interleave_ab.py, the ratio to the stored
// tiles on each build). Q5_0, the same tile, was not measured; Q8_0 takes the AMX tiles from 8 rows.
static constexpr int kRows = kFarPrefetch ? 16 : kMaxRows;

// Bits 0-3 of each dword lane to bit 4 of its bytes 0-3 (a fifth bit per value).
static __m512i spread(__m512i nibble) {
  return _mm512_slli_epi32(_mm512_and_si512(_mm512_mullo_epi32(nibble, _mm512_set1_epi32(0x00204081)),
                                            _mm512_set1_epi32(0x01010101)), 4);
}

template <int MB>
static void tile(const uint8_t* g, int64_t b0, int64_t b1, const uint8_t* act, int64_t stride, float* out) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc[MB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_loadu_ps(out + 16 * m);
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blk = g + b * kGroupBlock;
    prefetch_l2<kGroupBlock, kFarBytes / kGroupBlock, kFarHint>(blk);  // 8, 16, 13 blocks ahead
    __m512i w[8];
    if constexpr (Type == kQ8_0) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) w[k] = _mm512_xor_si512(_mm512_loadu_si512(blk + 64 * k), _mm512_set1_epi8(static_cast<char>(0x80)));
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i raw = _mm512_loadu_si512(blk + 64 * c);
        w[c] = _mm512_and_si512(raw, m4);
        w[4 + c] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      }
      if constexpr (Type == kQ5_0) {
        const __m512i qh = _mm512_loadu_si512(blk + 256), f = _mm512_set1_epi32(15);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          w[c] = _mm512_or_si512(w[c], spread(_mm512_and_si512(_mm512_srli_epi32(qh, 4 * c), f)));
          w[4 + c] = _mm512_or_si512(w[4 + c], spread(_mm512_and_si512(_mm512_srli_epi32(qh, 16 + 4 * c), f)));
        }
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kD)));
    const int h = static_cast<int>(b & 1);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const Act32* a = reinterpret_cast<const Act32*>(act + m * stride) + b / 2;
      const uint8_t* q = reinterpret_cast<const uint8_t*>(a->q) + 32 * h;
      __m512i isum = _mm512_set1_epi32(Type == kQ4_0 ? a->corr[8 * h] >> 4 : a->corr[8 * h]);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) isum = dot4(isum, w[k], q + 4 * k);
      acc[m] = _mm512_add_ps(acc[m], _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(a->d[8 * h])), _mm512_cvtepi32_ps(isum)));
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}
};

template <class K, int M = K::kRows>
inline void tile_n(int mb, const uint8_t* g, int64_t b0, int64_t b1, const uint8_t* act, int64_t stride, float* out) {
  if constexpr (M > 0) {
    if (mb == M) K::template tile<M>(g, b0, b1, act, stride, out);
    else tile_n<K, M - 1>(mb, g, b0, b1, act, stride, out);
  }
}

// The rows in tiles of sizes that differ by one at most (kRows a tile at most; with 4, 5 rows: 3 + 2, not
// 4 + 1): a tile of one or two rows costs nearly what a full one does. With more than one tile, a group is taken about 8 KiB of blocks
// at a time, every tile over them in turn, so that the later tiles read them from L1 while the stream goes
// on; a tile over the whole group before the next one's turn left the later tiles computing with no new
// memory in flight. On 2 Xeon cores, alternated: 0.88-0.95x the time from 6 to 16 rows for Q8_0, 0.94-0.97
// for IQ4_XS and Q4_0, 0.94-1.00 for Q4_K (each file's weights of the type, called as gguf_linear calls them;
// 5 rows: 0.98-1.01).
template <class K>
void run(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act, int64_t stride,
         int64_t nrows, float* y, int64_t ldy) {
  alignas(64) float out[16 * kRowChunk];  // the dispatch's calls hold at most kRowChunk rows
  const int64_t tiles = (nrows + K::kRows - 1) / K::kRows;
  const int64_t step = tiles == 1 ? nb : std::max<int64_t>(1, 8192 / K::kGroupBlock);
  for (int64_t g0 = o0 / kGroupRows * kGroupRows; g0 < o1; g0 += kGroupRows) {
    const int64_t lo = std::max(o0, g0), hi = std::min(o1, g0 + kGroupRows);
    const uint8_t* g = w + g0 * row_bytes;
    for (int64_t i = 0; i < 16 * nrows; i += 16) _mm512_store_ps(out + i, _mm512_setzero_ps());
    for (int64_t b0 = 0; b0 < nb; b0 += step) {
      const int64_t b1 = std::min(nb, b0 + step);
      for (int64_t t = 0, r = 0; t < tiles; ++t) {
        const int mb = static_cast<int>(nrows / tiles + (t < nrows % tiles ? 1 : 0));
        tile_n<K>(mb, g, b0, b1, act + r * stride, stride, out + 16 * r);
        r += mb;
      }
    }
    for (int64_t r = 0; r < nrows; ++r)
      for (int64_t o = lo; o < hi; ++o) y[r * ldy + o] = out[16 * r + (o - g0)];
  }
}

}  // namespace

void rows_interleaved(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
                      const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (base_type(type)) {
    case kQ6_K: run<Q6K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_K: run<Q4K<true>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kIQ4_XS: run<IQ4XS>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ8_0: run<Blocks32<kQ8_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ4_0: run<Blocks32<kQ4_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_0: run<Blocks32<kQ5_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    default: run<Q4K<false>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;  // Q4_K
  }
}

}  // namespace avx512
#pragma GCC pop_options
