// The AMX tiles (Intel AMX-INT8, beside AVX-512): many activation rows of Q4_K, Q5_K and Q6_K at once, for
// reading prompts. One TDPBSSD multiplies a 16 x 64 tile of int8 weights by a 64 x 16 tile of int8
// activations into 16 x 16 int32 sums, 16 times the work of a 512-bit vpdpbusd per instruction.
//
// Bit-identical to the one-row tiles: a K-quant block's result is two integer sums (isum = sum over
// sub-blocks of scale * (codes . activations), and for Q4_K / Q5_K msum = sum of min * activation sums)
// and then the same float operations per block as the scalar path. AMX computes exactly those integers:
//  - the scale goes into the weights, as two byte pieces: for Q4_K and Q5_K the scale splits as 16 a + b
//    (Q5_K: 8 a + b) and the pieces are the unsigned bytes b * code and a * code (TDPBUSD); for Q6_K
//    P = scale * (code - 32), at most 13 bits, splits as P = 128 * hi + lo with lo in [0, 127] and hi in
//    [-32, 32], both int8 (TDPBSSD). Then isum = lo . x + 16 (8, 128) * (hi . x) over the whole block, each
//    a tile product over 64 values at a time (no overflow: |isum| < 2^28);
//  - msum = sum of min * activation sum per sub-block, in AVX-512 (vpdpwssd) beside the tile products;
//  - the float work is the scalar path's, per block and activation row, in 16 lanes (lanes = activation rows).
// So a row's result never depends on the other rows or on the tile it lands in.
//
// Per call and thread: the activation rows are put into the tiles' VNNI layout once (16 rows' dword k side
// by side), and each block of a group of 16 weight rows is unpacked into its pieces (8 KB) as it comes, then read by
// every pair of tiles of 16 activation rows. A file of its own: one instruction set, and the only one that needs
// the kernel's permission (Linux keeps AMX's tile data off until a process asks for it).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "gguf_activations.h"
#include "gguf_amx_tiles.h"
#include "gguf_blocks.h"
#include "gguf_interleaved.h"
#include "gguf_paths.h"

namespace amx {

bool usable() {
#if SPECWISE_AMX
  static const bool ok = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8") ||
        !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni"))
      return false;
#if defined(__linux__)
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
#else
    return false;
#endif
  }();
  return ok;
#else
  return false;
#endif
}

// Rows from which a call takes the AMX tiles (fewer: the AVX-512 tiles, which pack nothing). The default
// target's weights of the type, 2 threads, Intel Xeon, AMX against AVX-512 tiles alternated in one process, ms:
// Q4_K 71.6 / 40.6 at 6 rows, 73.1 / 61.6 at 12, 75.3 / 74.5 at 16, 95.8 / 113.9 at 24, 97.5 / 142.7 at 32;
// Q6_K 36.8 / 31.9 at 12, 37.5 / 40.7 at 16, 42.9 / 79.3 at 32.
constexpr int64_t kMinRows = 16;
constexpr int64_t kMinRowsQ4K = 20;

bool takes(int64_t type, int64_t nrows) {
  type = base_type(type);
  if (type == kQ4_K) return nrows >= kMinRowsQ4K;
  return (type == kQ5_K || type == kQ6_K) && nrows >= kMinRows;
}

}  // namespace amx

#if SPECWISE_AMX
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
namespace amx {
namespace {

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 16 vectors of 16 dwords transposed: v[k] holds dword k of each v[j] (in lane j).
inline void transpose16(__m512i v[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Now v[4a + b] holds dword b' of rows 4a'..: 128-bit lane l of v[i] is rows 4l .. 4l + 3 of group i / 4.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    v[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    v[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    v[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

constexpr int64_t kActTile = 4 * 1024;  // one block of 16 activation rows: 4 tiles of 64 values
constexpr int64_t kPiece = 16 * 256;    // one block's piece (lo or hi) of 16 weight rows

// Activation rows [r0, r0 + 16) (rows past nrows zero) in VNNI order: for block b and values 64c..64c+63,
// 16 rows (value quad k) of 64 bytes (row j's values 64c + 4k .. + 3 at bytes 4j .. 4j + 3); the rows'
// scales, 16 floats a block; and for the mins, per block and k < 4, the rows' word pairs (bsum32[2k],
// bsum32[2k + 1]) as 16 dwords.
void pack_activations(const uint8_t* act, int64_t stride, int64_t r0, int64_t nrows, int64_t nb, uint8_t* vnni,
                      float* scales, uint32_t* pairs) {
  for (int64_t b = 0; b < nb; ++b) {
    for (int c = 0; c < 4; ++c) {
      __m512i v[16];
      for (int j = 0; j < 16; ++j)
        v[j] = r0 + j < nrows
                   ? _mm512_load_si512(reinterpret_cast<const ActK*>(act + (r0 + j) * stride)[b].q + 64 * c)
                   : _mm512_setzero_si512();
      transpose16(v);
      for (int k = 0; k < 16; ++k) _mm512_store_si512(vnni + b * kActTile + c * 1024 + 64 * k, v[k]);
    }
    for (int j = 0; j < 16; ++j) {
      const bool real = r0 + j < nrows;
      const ActK* a = real ? reinterpret_cast<const ActK*>(act + (r0 + j) * stride) + b : nullptr;
      scales[16 * b + j] = real ? a->d : 0.f;
      for (int k = 0; k < 4; ++k)
        pairs[64 * b + 16 * k + j] = real ? static_cast<uint16_t>(a->bsum32[2 * k]) |
                                                static_cast<uint32_t>(static_cast<uint16_t>(a->bsum32[2 * k + 1])) << 16
                                          : 0u;
    }
  }
}

// 32 words (codes 0..63) times a scale per 16 of them, as P's pieces: lo (P & 127) and hi (P >> 7) bytes.
inline void pieces(__m512i codes, __m512i scale, uint8_t* lo, uint8_t* hi) {
  const __m512i p = _mm512_mullo_epi16(codes, scale);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lo), _mm512_cvtepi16_epi8(_mm512_and_si512(p, _mm512_set1_epi16(127))));
  _mm256_store_si256(reinterpret_cast<__m256i*>(hi), _mm512_cvtepi16_epi8(_mm512_srai_epi16(p, 7)));
}

// Q4_K (Five: Q5_K): a weight row's block as unsigned pieces lo and hi [256], d, dmin, and its mins as
// word pairs (mn[2k], mn[2k + 1]) for k < 4. The scale splits as 16 a + b (Q5_K, whose codes reach 31:
// 8 a + b), so that b * code and a * code are bytes: one vpmullw each over the codes as words, two codes a
// word (their products never carry into each other); isum = lo + (hi << kShift).
template <bool Five>
struct Q4KPieces {
  static constexpr int64_t kBytes = Five ? 176 : 144, kQs = Five ? 48 : 16;
  static constexpr bool kMins = true, kUnsigned = true;
  static constexpr int kShift = Five ? 3 : 4;
  static void pack_row(const uint8_t* blk, uint8_t* lo, uint8_t* hi, float* d, float* dmin, uint32_t* mins) {
    uint8_t sc[8], mn[8];
    q4k_scales(blk + 4, sc, mn);
    *d = half(blk);
    *dmin = half(blk + 2);
    for (int k = 0; k < 4; ++k) mins[k] = mn[2 * k] | static_cast<uint32_t>(mn[2 * k + 1]) << 16;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i qh = Five ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)) : _mm256_setzero_si256();
    constexpr int kLow = (1 << kShift) - 1;
    for (int g = 0; g < 4; ++g) {  // values 64g .. 64g + 63: sub-blocks 2g (low nibbles) and 2g + 1 (high)
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQs + 32 * g));
      __m256i u0 = _mm256_and_si256(raw, m4), u1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (Five) {  // bit 2g (2g + 1) of qh[l] is the fifth bit of value 64g + l (64g + 32 + l)
        const __m256i one = _mm256_set1_epi8(1);
        u0 = _mm256_or_si256(u0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
        u1 = _mm256_or_si256(u1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
      }
      const __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1);
      const int s0 = sc[2 * g], s1 = sc[2 * g + 1];
      const __m512i fb = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(s0 & kLow)),
                                            _mm256_set1_epi16(static_cast<int16_t>(s1 & kLow)), 1);
      const __m512i fa = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(s0 >> kShift)),
                                            _mm256_set1_epi16(static_cast<int16_t>(s1 >> kShift)), 1);
      _mm512_store_si512(lo + 64 * g, _mm512_mullo_epi16(codes, fb));
      _mm512_store_si512(hi + 64 * g, _mm512_mullo_epi16(codes, fa));
    }
  }
};

// Q6_K: P = scale * (code - 32), sixteen 16-value sub-blocks; no mins.
struct Q6KPieces {
  static constexpr int64_t kBytes = 210;
  static constexpr bool kMins = false, kUnsigned = false;
  static constexpr int kShift = 7;
  static void pack_row(const uint8_t* blk, uint8_t* lo, uint8_t* hi, float* d, float* dmin, uint32_t* mins) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    *d = half(blk + 208);
    *dmin = 0.f;
    for (int k = 0; k < 4; ++k) mins[k] = 0;
    const __m256i m4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    const __m512i off = _mm512_set1_epi16(32);
    for (int h = 0; h < 2; ++h) {  // values 128h + 32s + l: low nibble (s < 2) or high (s >= 2) of
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      for (int s = 0; s < 4; ++s) {  // ql[64h + 32(s & 1) + l], bits 2s, 2s + 1 of qh[32h + l] above them
        const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (s & 1)));
        const __m256i nib = s >= 2 ? _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4) : _mm256_and_si256(ql, m4);
        const __m256i two = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), three);
        const __m256i u = _mm256_or_si256(nib, _mm256_slli_epi16(two, 4));
        const int v0 = 128 * h + 32 * s, g = v0 / 16;
        const __m512i scale = _mm512_inserti64x4(_mm512_set1_epi16(sc[g]), _mm256_set1_epi16(sc[g + 1]), 1);
        pieces(_mm512_sub_epi16(_mm512_cvtepu8_epi16(u), off), scale, lo + v0, hi + v0);
      }
    }
  }
};

// A group's block: pieces lo, hi [16][256], then d [16], dmin [16], then the mins' pairs [16][4].
constexpr int64_t kBlockStride = 2 * kPiece + 128 + 256;

// Block b of weight rows [g, g + n), n <= 16, as K's pieces at p (rows past n zero). An interleaved weight
// (gguf_interleaved.h) gives each row's block back as stored first: the pieces are the same.
template <class K>
void pack_block(const uint8_t* w, int64_t type, int64_t row_bytes, int64_t g, int n, int64_t b, uint8_t* p) {
  alignas(64) uint8_t raw[256];
  float* d = reinterpret_cast<float*>(p + 2 * kPiece);
  uint32_t* mins = reinterpret_cast<uint32_t*>(p + 2 * kPiece + 128);
  for (int i = 0; i < 16; ++i) {
    if (i < n) {
      const int64_t o = g + i;
      const uint8_t* blk = w + o * row_bytes + b * K::kBytes;
      if (interleaved(type)) {
        raw_block_of(type, w, row_bytes, o, b, raw);
        blk = raw;
      } else {
        prefetch_ahead(blk, K::kBytes);
      }
      K::pack_row(blk, p + 256 * i, p + kPiece + 256 * i, d + i, d + 16 + i, mins + 4 * i);
    } else {
      std::memset(p + 256 * i, 0, 256);
      std::memset(p + kPiece + 256 * i, 0, 256);
      d[i] = d[16 + i] = 0.f;
      for (int k = 0; k < 4; ++k) mins[4 * i + k] = 0;
    }
  }
}

// The activation side of one tile of 16 rows.
struct ActTile {
  const uint8_t* vnni;    // kActTile bytes a block
  const float* scales;    // 16 a block
  const uint32_t* pairs;  // 64 a block
};

// The float work of one block for one tile of activation rows, as the one-row tiles do it per row:
// acc[i] lane j += (d_i * d_j) * isum - (dmin_i * d_j) * msum.
template <class K>
inline void finish_block(const uint8_t* p, const int32_t (*lo)[16], const int32_t (*hi)[16], const ActTile& a,
                         int64_t b, float (*acc)[16]) {
  const float* d = reinterpret_cast<const float*>(p + 2 * kPiece);
  const uint32_t* mins = reinterpret_cast<const uint32_t*>(p + 2 * kPiece + 128);
  const __m512 da = _mm512_load_ps(a.scales + 16 * b);
  __m512i bs[4];
  if constexpr (K::kMins)
    for (int k = 0; k < 4; ++k) bs[k] = _mm512_load_si512(a.pairs + 64 * b + 16 * k);
  for (int i = 0; i < 16; ++i) {
    const __m512i isum = _mm512_add_epi32(_mm512_load_si512(lo[i]), _mm512_slli_epi32(_mm512_load_si512(hi[i]), K::kShift));
    __m512 v = _mm512_add_ps(_mm512_load_ps(acc[i]), _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d[i]), da),
                                                                   _mm512_cvtepi32_ps(isum)));
    if constexpr (K::kMins) {
      __m512i msum = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k)
        msum = _mm512_dpwssd_epi32(msum, _mm512_set1_epi32(static_cast<int>(mins[4 * i + k])), bs[k]);
      v = _mm512_sub_ps(v, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d[16 + i]), da), _mm512_cvtepi32_ps(msum)));
    }
    _mm512_store_ps(acc[i], v);
  }
}

// Tile c += a . b, a's bytes unsigned (the K-quants' pieces) or signed (Q6_K's), b's (the activations)
// signed. A macro: the intrinsics name their tiles in the instruction's text.
#define SPECWISE_TILE_DP(unsigned_a, c, a, b) \
  do {                                         \
    if constexpr (unsigned_a) _tile_dpbusd(c, a, b); \
    else _tile_dpbssd(c, a, b);                \
  } while (0)

// One group of 16 weight rows (its pieces) against T (1 or 2) tiles of 16 activation rows: acc[t][i] lane
// j = weight row i . activation row j of tile t. Tiles: 4-5 the weight pieces lo and hi, 6-7 the
// activations, 0-3 the sums (tile t's lo in 2t, hi in 2t + 1). A block's float work runs after the next
// block's tile products are issued, so that the two overlap.
//
// Each block's pieces are made as the block comes, into one of two slots that stay in L1 (block b's
// products run while block b + 1's pieces are made): a panel of the whole group's pieces, made once for
// every pair of act tiles, spilled to L2 and cost more than making them again per pair.
template <class K, int T>
void tile(const uint8_t* w, int64_t type, int64_t row_bytes, int64_t g, int n, uint8_t* slots, const ActTile* a,
          int64_t nb, float (*acc)[16][16]) {
  alignas(64) int32_t sums[2][4][16][16];
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < 16; ++i) _mm512_store_ps(acc[t][i], _mm512_setzero_ps());
  for (int64_t b = 0; b <= nb; ++b) {
    if (b < nb) {
      uint8_t* p = slots + (b & 1) * kBlockStride;
      pack_block<K>(w, type, row_bytes, g, n, b, p);
      _tile_zero(0);
      _tile_zero(1);
      if constexpr (T == 2) {
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int c = 0; c < 4; ++c) {
        _tile_loadd(4, p + 64 * c, 256);
        _tile_loadd(5, p + kPiece + 64 * c, 256);
        _tile_loadd(6, a[0].vnni + b * kActTile + 1024 * c, 64);
        SPECWISE_TILE_DP(K::kUnsigned, 0, 4, 6);
        SPECWISE_TILE_DP(K::kUnsigned, 1, 5, 6);
        if constexpr (T == 2) {
          _tile_loadd(7, a[1].vnni + b * kActTile + 1024 * c, 64);
          SPECWISE_TILE_DP(K::kUnsigned, 2, 4, 7);
          SPECWISE_TILE_DP(K::kUnsigned, 3, 5, 7);
        }
      }
      int32_t(*s)[16][16] = sums[b & 1];
      _tile_stored(0, s[0], 64);
      _tile_stored(1, s[1], 64);
      if constexpr (T == 2) {
        _tile_stored(2, s[2], 64);
        _tile_stored(3, s[3], 64);
      }
    }
    if (b > 0) {
      const uint8_t* p = slots + ((b - 1) & 1) * kBlockStride;
      int32_t(*s)[16][16] = sums[(b - 1) & 1];
      for (int t = 0; t < T; ++t) finish_block<K>(p, s[2 * t], s[2 * t + 1], a[t], b - 1, acc[t]);
    }
  }
}

template <class K>
void run(const uint8_t* w, int64_t type, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
         int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  static thread_local std::vector<uint8_t> act_store, side_store, slot_store;
  const int64_t tiles = (nrows + 15) / 16;
  constexpr int64_t kSide = 64 + 256;  // a block's scales and pairs
  uint8_t* vnni = scratch(act_store, static_cast<size_t>(tiles * nb * kActTile));
  uint8_t* side = scratch(side_store, static_cast<size_t>(tiles * nb * kSide));
  uint8_t* slots = scratch(slot_store, static_cast<size_t>(2 * kBlockStride));
  std::vector<ActTile> at(tiles);
  for (int64_t t = 0; t < tiles; ++t) {
    uint8_t* s = side + t * nb * kSide;
    at[t] = {vnni + t * nb * kActTile, reinterpret_cast<float*>(s), reinterpret_cast<uint32_t*>(s + nb * 64)};
    pack_activations(act, stride, 16 * t, nrows, nb, vnni + t * nb * kActTile, reinterpret_cast<float*>(s),
                     reinterpret_cast<uint32_t*>(s + nb * 64));
  }
  const TileConfig config({16, 16, 16, 16, 16, 16, 16, 16});  // what each tile holds: tile() above
  load_tile_config(config);
  alignas(64) float acc[2][16][16];
  for (int64_t g = o0; g < o1; g += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, o1 - g));
    for (int64_t t = 0; t < tiles; t += 2) {
      const int pair = t + 1 < tiles ? 2 : 1;
      if (pair == 2) tile<K, 2>(w, type, row_bytes, g, n, slots, &at[t], nb, acc);
      else tile<K, 1>(w, type, row_bytes, g, n, slots, &at[t], nb, acc);
      for (int u = 0; u < pair; ++u) {
        __m512i v[16];
        for (int i = 0; i < 16; ++i) v[i] = _mm512_castps_si512(_mm512_load_ps(acc[u][i]));
        transpose16(v);  // v[j] lane i = weight row i . activation row j
        const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1);
        const int64_t r0 = 16 * (t + u), rows = std::min<int64_t>(16, nrows - r0);
        for (int64_t j = 0; j < rows; ++j) _mm512_mask_storeu_ps(y + (r0 + j) * ldy + g, valid, _mm512_castsi512_ps(v[j]));
      }
    }
  }
  _tile_release();
}

}  // namespace

void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
          int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (base_type(type)) {
    case kQ4_K: run<Q4KPieces<false>>(w, type, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_K: run<Q4KPieces<true>>(w, type, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ6_K: run<Q6KPieces>(w, type, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
  }
}

}  // namespace amx
#pragma GCC pop_options
#else
namespace amx {
void rows(int64_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*,
          int64_t) {}
}  // namespace amx
#endif
