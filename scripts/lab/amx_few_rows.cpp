// AMX tiles for 1-8 activation rows of Q4_K and Q5_K: an experiment specwise does not ship
// (docs/BENCHMARKS.md, "AMX tiles for few rows"). scripts/lab/amx_few_rows.py builds it into a copy of the
// kernel module, where gguf_linear.cpp's dispatch sends 1-8 rows of these types on the amx path here.
//
// The product's AMX tiles (specwise/kernels/gguf_amx.cpp) fold each sub-block's scale into the weights,
// two int8 pieces a value, which pays only over many rows. Here the codes go into the tiles as stored:
// per block and group of 16 weight rows, for each pair of sub-blocks (64 values, 32 stored bytes a row),
//  - the rows' 32 bytes are transposed into eight 64-byte tile rows (dword k of every weight row side by
//    side); their low and high nibbles are the two sub-blocks' codes, one 16 x 64-byte weight tile;
//  - the activation tile holds the pair's values in its own band of rows (the low sub-block's 32 values
//    then zeros, zeros then the high one's), so that one TDPBSUD gives both sub-blocks' sums in their own
//    rows, and one sum tile holds G pairs (2 x rows x G tile rows: G = 4 for 1-2 rows, 2 for 3-4, 1 above);
//  - the sums are multiplied by the sub-blocks' scales in 16 lanes, one a weight row; the mins and the
//    float work follow, per block and activation row, as the one-row tiles do them (bit-identical: isum and
//    msum are exact integers, and acc + (d * d_a) * isum, then - (dmin * d_a) * msum).
// Variants (environment, read once):
//  - SPECWISE_FEW_ROWS_LAYOUT = stored (default) | repacked: the weights as the file stores them, or repacked
//    by amx_few_rows.py in groups of 16 rows, each block's dword d of the 16 rows side by side (64 bytes at
//    16 * offset within the group's block), so that the transposes become plain loads and each thread reads
//    one sequential stream; the same bytes, another order.
//  - SPECWISE_FEW_ROWS_PREFETCH = none (default) | rows (stored: each row's bytes 2304 ahead into L1 and 9216
//    into L2, as the product's tiles do; repacked: the stream's) | group (stored: the next group of rows into
//    L2, spread over each block's transposes).
//  - SPECWISE_FEW_ROWS_SKIP = none (default) | math (no tile loads or products) | finish (no scaling or float
//    work) | both: wrong results, for timing what each part adds.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <cstdlib>
#include <vector>

#include "gguf_activations.h"
#include "gguf_blocks.h"
#include "gguf_paths.h"

#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define SPECWISE_AMX_THIN 1
#else
#define SPECWISE_AMX_THIN 0
#endif

namespace amx {

bool thin_takes(int64_t type, int64_t nrows) {
  return SPECWISE_AMX_THIN && (type == kQ4_K || type == kQ5_K) && nrows >= 1 && nrows <= 8;
}

}  // namespace amx

#if SPECWISE_AMX_THIN
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c")
namespace amx {
namespace {

// Tiles 0-1: the sums of a sub-block pair (n rows of 16 dwords); 2-3: its activations (n rows of 32 bytes);
// 4-5: its weight codes (8 rows of 64 bytes).
struct alignas(64) ThinConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// 16 rows of 8 dwords (row i at p[i] + offset): t[k] lane i = dword k of row i.
inline void transpose_16x8(const uint8_t* const p[16], int64_t offset, __m512i t[8]) {
  __m512i z[8], a[8], b[8];
  for (int i = 0; i < 8; ++i)  // row i in lanes 0-7, row i + 8 in lanes 8-15
    z[i] = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[i] + offset))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[i + 8] + offset)), 1);
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    b[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
    b[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
    b[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
    b[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  // b[c] (rows 0-3 and 8-11) and b[4 + c] (rows 4-7, 12-15), 128-bit lanes: dword c of the first rows, dword
  // c + 4 of them, dword c of the second rows, dword c + 4 of them.
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_permutex2var_epi64(b[c], first, b[4 + c]);
    t[c + 4] = _mm512_permutex2var_epi64(b[c], second, b[4 + c]);
  }
}

// The first 16 bytes of 16 rows' blocks (d, dmin and the twelve scale bytes): h[c] lane i = dword c of row i.
inline void transpose_16x4(const uint8_t* const p[16], int64_t offset, __m512i h[4]) {
  __m512i z[4];
  for (int j = 0; j < 4; ++j) {  // 128-bit lane l: row j + 4l
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[j] + offset)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[j + 4] + offset)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[j + 8] + offset)), 2);
    z[j] = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[j + 12] + offset)), 3);
  }
  const __m512i a0 = _mm512_unpacklo_epi32(z[0], z[1]), a1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i a2 = _mm512_unpacklo_epi32(z[2], z[3]), a3 = _mm512_unpackhi_epi32(z[2], z[3]);
  h[0] = _mm512_unpacklo_epi64(a0, a2);
  h[1] = _mm512_unpackhi_epi64(a0, a2);
  h[2] = _mm512_unpacklo_epi64(a1, a3);
  h[3] = _mm512_unpackhi_epi64(a1, a3);
}

// vpshufb indices within each dword: byte j as a dword (j < 4), or bytes (j, j + 1) as two words.
inline __m512i dword_bases(uint32_t unit) {  // unit * (the dword's place in its 128-bit lane)
  const int u = static_cast<int>(unit);
  return _mm512_setr_epi32(0, 4 * u, 8 * u, 12 * u, 0, 4 * u, 8 * u, 12 * u, 0, 4 * u, 8 * u, 12 * u, 0, 4 * u, 8 * u, 12 * u);
}
inline __m512i byte_index(int j) {
  return _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(0x80808000u | static_cast<uint32_t>(j))), dword_bases(1));
}
inline __m512i pair_index(int j) {
  return _mm512_add_epi32(
      _mm512_set1_epi32(static_cast<int>(0x80008000u | static_cast<uint32_t>(j) | static_cast<uint32_t>(j + 1) << 16)),
      dword_bases(0x10001));
}

// One block's header for 16 weight rows: scales (bytes 0-3 of sc_lo: sub-blocks 0-3; of sc_hi: 4-7), the mins
// as word pairs (mn[2j], mn[2j + 1]), d and dmin.
struct Header {
  __m512i sc_lo, sc_hi, mins[4];
  __m512 d, dmin;
};

std::string setting(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}
static const bool kRepacked = setting("SPECWISE_FEW_ROWS_LAYOUT", "stored") == "repacked";

// v[k], k < N (4 or 8): lane i = dword k of the N dwords at byte `offset` of row i's block, whose first byte is
// p[i] + at (stored) or, repacked, the group's block at p[0] + at (its dword d of row i at 64 d + 4 i).
template <int N>
inline void dwords16(const uint8_t* const p[16], int64_t at, int64_t offset, __m512i* v) {
  if (kRepacked) {
    for (int k = 0; k < N; ++k) v[k] = _mm512_loadu_si512(p[0] + at + 16 * offset + 64 * k);
  } else if constexpr (N == 8) {
    transpose_16x8(p, at + offset, v);
  } else {
    transpose_16x4(p, at + offset, v);
  }
}

inline void decode_header(const uint8_t* const p[16], int64_t at, Header& out) {
  __m512i h[4];
  dwords16<4>(p, at, 0, h);  // gguf_blocks.h, q4k_scales, in 16 lanes
  const __m512i six = _mm512_set1_epi32(0x3f3f3f3f), four = _mm512_set1_epi32(0x0f0f0f0f);
  const __m512i top = _mm512_set1_epi32(0x30303030);
  out.sc_lo = _mm512_and_si512(h[1], six);
  const __m512i mn_lo = _mm512_and_si512(h[2], six);
  out.sc_hi = _mm512_or_si512(_mm512_and_si512(h[3], four), _mm512_and_si512(_mm512_srli_epi32(h[1], 2), top));
  const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 4), four),
                                        _mm512_and_si512(_mm512_srli_epi32(h[2], 2), top));
  out.mins[0] = _mm512_shuffle_epi8(mn_lo, pair_index(0));
  out.mins[1] = _mm512_shuffle_epi8(mn_lo, pair_index(2));
  out.mins[2] = _mm512_shuffle_epi8(mn_hi, pair_index(0));
  out.mins[3] = _mm512_shuffle_epi8(mn_hi, pair_index(2));
  out.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
  out.dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16)));
}

// Buffers per thread that only grow, 64-byte aligned.
uint8_t* aligned(std::vector<uint8_t>& store, size_t bytes) {
  if (store.size() < bytes + 64) store.resize(bytes + 64);
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
}
uint8_t* thin_scratch(size_t bytes) {
  static thread_local std::vector<uint8_t> store;
  return aligned(store, bytes);
}

int prefetch_setting() {
  const std::string s = setting("SPECWISE_FEW_ROWS_PREFETCH", "none");
  return s == "rows" ? 4 : s == "group" ? 1 : 0;
}
static const int kMode = prefetch_setting();
static const std::string kSkip = setting("SPECWISE_FEW_ROWS_SKIP", "none");
static const bool kSkipMath = kSkip == "math" || kSkip == "both", kSkipFinish = kSkip == "finish" || kSkip == "both";

// N activation rows (1-8). A sum tile holds G sub-block pairs: rows (2u) N + r and (2u + 1) N + r are the
// low and high sub-block of pair u for activation row r. An activation tile holds one pair's values in the
// rows of its band (zeros elsewhere), so that each product lands in its own rows of the sum tile.
template <bool Five, int N>
void run_thin(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
              int64_t stride, float* y, int64_t ldy) {
  constexpr int64_t kBytes = Five ? 176 : 144, kQs = Five ? 48 : 16;
  if (kRepacked && (o0 % 16 != 0 || (o1 - o0) % 16 != 0)) {
    std::fprintf(stderr, "repacked weights are read in whole groups of 16 rows, not [%lld, %lld)\n",
                 static_cast<long long>(o0), static_cast<long long>(o1));
    std::abort();
  }
  constexpr int G = N <= 2 ? 4 : N <= 4 ? 2 : 1, R = 2 * N * G;
  constexpr int64_t kTile = R * 64;
  // The activation tiles of every block and pair, once per call.
  uint8_t* tiles = thin_scratch(static_cast<size_t>(nb * 4 * kTile));
  std::memset(tiles, 0, static_cast<size_t>(nb * 4 * kTile));
  for (int64_t b = 0; b < nb; ++b)
    for (int q = 0; q < 4; ++q) {
      uint8_t* t = tiles + (b * 4 + q) * kTile;
      const int u = q % G;
      for (int r = 0; r < N; ++r) {
        const int8_t* v = (reinterpret_cast<const ActK*>(act + r * stride) + b)->q + 64 * q;
        std::memcpy(t + ((2 * u) * N + r) * 64, v, 32);
        std::memcpy(t + ((2 * u + 1) * N + r) * 64 + 32, v + 32, 32);
      }
    }
  ThinConfig config;
  for (int t = 0; t < 6; ++t) config.colsb[t] = 64, config.rows[t] = R;
  for (int t = 6; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
  alignas(64) uint8_t codes[2][4][1024];   // a block's weight tiles, per pair: 16 rows of 64 bytes
  alignas(64) int32_t sums[2][4][16][16];  // its sum tiles
  Header head[3];  // block b's in head[b % 3]: b + 1's is decoded before b - 1's is used
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const uint8_t* p[16];
  const uint8_t* next = w;  // the next group's first row
  // Block b's weight tiles and header into codes[b & 1], head[b % 3].
  auto prepare = [&](int64_t b) {
    const int64_t at = b * (kRepacked ? 16 * kBytes : kBytes);
    decode_header(p, at, head[b % 3]);
    __m512i qh[8];
    if constexpr (Five) dwords16<8>(p, at, 16, qh);
    if (kMode & 4)  // as the product's tiles prefetch a row: each row's block, or the repacked group's one stream
      for (int i = 0; i < (kRepacked ? 1 : 16); ++i)
        for (int64_t j = 0; j < (kRepacked ? 16 * kBytes : kBytes); j += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(p[i] + at + j + kPrefetchAhead), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(p[i] + at + j + kFarAhead), _MM_HINT_T2);
        }
    for (int q = 0; q < 4; ++q) {
      if ((kMode & 1) && !kRepacked) {  // a quarter of the next group's slice for block b, spread between the transposes
        const uint8_t* slice = next + b * 16 * kBytes + q * 4 * kBytes;
        for (int64_t i = 0; i < 4 * kBytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(slice + i), _MM_HINT_T1);
      }
      __m512i t[8];
      dwords16<8>(p, at, kQs + 32 * q, t);
      uint8_t* c = codes[b & 1][q];
      for (int k = 0; k < 8; ++k) {
        __m512i lo = _mm512_and_si512(t[k], m4), hi = _mm512_and_si512(_mm512_srli_epi16(t[k], 4), m4);
        if constexpr (Five) {  // bit 2q (2q + 1) of qh[l] is the fifth bit of value 64q + l (64q + 32 + l)
          const __m512i bit = _mm512_set1_epi8(0x10);
          lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_rolv_epi32(qh[k], _mm512_set1_epi32(4 - 2 * q + 32)), bit));
          hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_rolv_epi32(qh[k], _mm512_set1_epi32(3 - 2 * q + 32)), bit));
        }
        _mm512_store_si512(c + 64 * k, lo);
        _mm512_store_si512(c + 512 + 64 * k, hi);
      }
    }
  };
  // Block b's tile products into sums[b & 1]: tiles 0-3 the sums, 4-5 activations, 6-7 weights.
  auto multiply = [&](int64_t b) {
    const uint8_t* cb = codes[b & 1][0];
    const uint8_t* ab = tiles + b * 4 * kTile;
// (GCC's tile intrinsics paste the tile numbers into the instruction's text: literals only.)
#define SPECWISE_THIN_PAIR(J, Q, A, B)       \
  _tile_loadd(B, cb + 1024 * (Q), 64);       \
  _tile_loadd(A, ab + (Q) * kTile, 64);      \
  _tile_dpbsud(J, A, B);
    if constexpr (G == 4) {
      _tile_zero(0);
      SPECWISE_THIN_PAIR(0, 0, 4, 6) SPECWISE_THIN_PAIR(0, 1, 5, 7) SPECWISE_THIN_PAIR(0, 2, 4, 6)
      SPECWISE_THIN_PAIR(0, 3, 5, 7)
      _tile_stored(0, sums[b & 1][0], 64);
    } else if constexpr (G == 2) {
      _tile_zero(0);
      _tile_zero(1);
      SPECWISE_THIN_PAIR(0, 0, 4, 6) SPECWISE_THIN_PAIR(0, 1, 5, 7) SPECWISE_THIN_PAIR(1, 2, 4, 6)
      SPECWISE_THIN_PAIR(1, 3, 5, 7)
      _tile_stored(0, sums[b & 1][0], 64);
      _tile_stored(1, sums[b & 1][1], 64);
    } else {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      SPECWISE_THIN_PAIR(0, 0, 4, 6) SPECWISE_THIN_PAIR(1, 1, 5, 7) SPECWISE_THIN_PAIR(2, 2, 4, 6)
      SPECWISE_THIN_PAIR(3, 3, 5, 7)
      _tile_stored(0, sums[b & 1][0], 64);
      _tile_stored(1, sums[b & 1][1], 64);
      _tile_stored(2, sums[b & 1][2], 64);
      _tile_stored(3, sums[b & 1][3], 64);
    }
#undef SPECWISE_THIN_PAIR
  };
  __m512 acc[N];
  // Block b's sums times its scales, its mins, and the float work, into acc.
  auto finish = [&](int64_t b) {
    const Header& h = head[b % 3];
    __m512i isum[N];
    for (int r = 0; r < N; ++r) isum[r] = _mm512_setzero_si512();
    for (int q = 0; q < 4; ++q) {
      const int32_t(*c)[16] = sums[b & 1][q / G] + 2 * (q % G) * N;
      const __m512i s0 = _mm512_shuffle_epi8(q < 2 ? h.sc_lo : h.sc_hi, byte_index(2 * q % 4));
      const __m512i s1 = _mm512_shuffle_epi8(q < 2 ? h.sc_lo : h.sc_hi, byte_index(2 * q % 4 + 1));
      for (int r = 0; r < N; ++r)
        isum[r] = _mm512_add_epi32(isum[r], _mm512_add_epi32(_mm512_mullo_epi32(_mm512_load_si512(c[r]), s0),
                                                             _mm512_mullo_epi32(_mm512_load_si512(c[N + r]), s1)));
    }
    for (int r = 0; r < N; ++r) {
      const ActK* a = reinterpret_cast<const ActK*>(act + r * stride) + b;
      int32_t bp[4];
      std::memcpy(bp, a->bsum32, 16);
      __m512i msum = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) msum = _mm512_dpwssd_epi32(msum, h.mins[j], _mm512_set1_epi32(bp[j]));
      const __m512 ad = _mm512_set1_ps(a->d);
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(h.d, ad), _mm512_cvtepi32_ps(isum[r])));
      acc[r] = _mm512_sub_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(h.dmin, ad), _mm512_cvtepi32_ps(msum)));
    }
  };
  for (int64_t g = o0; g < o1; g += 16) {
    const int rows = static_cast<int>(std::min<int64_t>(16, o1 - g));
    for (int i = 0; i < 16; ++i)  // stored rows past the end: repeat the last (repacked: whole groups only)
      p[i] = w + (g + (kRepacked ? 0 : std::min(i, rows - 1))) * row_bytes;
    next = w + (g + 16) * row_bytes;
    for (int r = 0; r < N; ++r) acc[r] = _mm512_setzero_ps();
    // Three blocks in flight: b's products, b + 1's weight tiles, b - 1's sums (whose products came last time).
    prepare(0);
    for (int64_t b = 0; b <= nb; ++b) {
      if (b < nb && !kSkipMath) multiply(b);
      if (b + 1 < nb) prepare(b + 1);
      if (b > 0 && !kSkipFinish) finish(b - 1);
    }
    const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1);
    for (int r = 0; r < N; ++r) _mm512_mask_storeu_ps(y + r * ldy + g, valid, acc[r]);
  }
  _tile_release();
}

template <bool Five>
void run_thin_rows(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
                   int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (nrows) {
    case 1: return run_thin<Five, 1>(w, row_bytes, o0, o1, nb, act, stride, y, ldy);
    case 2: return run_thin<Five, 2>(w, row_bytes, o0, o1, nb, act, stride, y, ldy);
    case 3: return run_thin<Five, 3>(w, row_bytes, o0, o1, nb, act, stride, y, ldy);
    case 4: return run_thin<Five, 4>(w, row_bytes, o0, o1, nb, act, stride, y, ldy);
    case 5: return run_thin<Five, 5>(w, row_bytes, o0, o1, nb, act, stride, y, ldy);
    case 6: return run_thin<Five, 6>(w, row_bytes, o0, o1, nb, act, stride, y, ldy);
    case 7: return run_thin<Five, 7>(w, row_bytes, o0, o1, nb, act, stride, y, ldy);
    default: return run_thin<Five, 8>(w, row_bytes, o0, o1, nb, act, stride, y, ldy);
  }
}

}  // namespace

void thin_rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
               const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  if (type == kQ4_K) run_thin_rows<false>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
  else run_thin_rows<true>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
}

}  // namespace amx
#pragma GCC pop_options
#else
namespace amx {
void thin_rows(int64_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*,
               int64_t) {}
}  // namespace amx
#endif
