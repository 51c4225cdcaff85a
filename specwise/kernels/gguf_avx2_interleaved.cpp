// The AVX2 tiles of the interleaved layout (gguf_interleaved.h): Q4_K, IQ4_XS, Q8_0 and Q4_0 (the other types'
// groups are read back into stored blocks: with AVX2's 16 registers, tiles of Q6_K and Q5_0 that unpack
// their high bits per row tile ran up to twice as slow as the stored ones). A group's 16 rows are two
// halves of 8 lanes (rows 0-7 in the first 32 bytes of each 64-byte run, rows 8-15 in the second), and
// each activation row's 4 codes, broadcast once, meet both halves. Without VNNI the codes meet in
// vpmaddubsw (unsigned weight codes times signed activations, pairs summed into words) and the words
// reach 32 bits in one vpmaddwd, against the sub-block's scale as a pair of words where the format has one
// (so the scale costs no vpmulld). The word sums are bounded so that nothing saturates:
//   Q4_K, Q4_0: codes 0-15, |a| <= 127: a pair <= 3810, eight pairs summed <= 30480;
//   Q8_0, IQ4_XS: signed values, their magnitudes (<= 128) against the activations carrying their signs
//   (vpsignb): a pair <= 32512, each widened at once.
// (The activations are in [-127, 127]: gguf_quantize.cpp.) A block's integer sums are those of the scalar
// path and its float steps the scalar path's, so every lane is bitwise the scalar path's row
// (gguf_scalar.cpp), whatever rows share the tile.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gguf_activations.h"
#include "gguf_interleaved.h"
#include "gguf_paths.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
namespace {


inline __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// The 4 bytes at p in every dword: one vpbroadcastd from memory, which each row's codes feed both halves.
typedef int32_t unaligned_i32 __attribute__((may_alias, aligned(1)));
inline __m256i bcast(const void* p) { return _mm256_set1_epi32(*static_cast<const unaligned_i32*>(p)); }
// 8 fp16 at p as floats.
inline __m256 halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// A small signed integer per dword as the same value in both its words (vpmaddwd's other operand).
inline __m256i word_pair(__m256i v) { return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16)); }
// Word pairs summed into dwords.
inline __m256i widen(__m256i words) { return _mm256_madd_epi16(words, _mm256_set1_epi16(1)); }
// The magnitudes of signed weight bytes against the activations carrying their signs: 4 products per
// dword, in word pairs (each pair <= 2 * 128 * 127).
inline __m256i signed_pairs(__m256i v, __m256i x) { return _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x, v)); }

// The group block kAhead bytes ahead into L2, as the AVX-512 tiles do (gguf_avx512_interleaved.cpp).
constexpr int64_t kAhead = 16384;
template <int64_t Bytes>
inline void prefetch_l2(const uint8_t* blk) {
  for (int64_t o = 0; o < Bytes; o += 64) __builtin_prefetch(blk + kAhead + o, 0, 2);
}

// out[16 m + 8 h + r] += (d_h * da_m) * isum[m][h] (the scalar path's float step), d_h the fp16 scales of
// rows 8 h .. 8 h + 7 at d + 16 h.
template <int MB>
inline void add_block(float* out, const uint8_t* d, const float* da, const __m256i (*isum)[2]) {
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
    for (int h = 0; h < 2; ++h) {
      float* o = out + 16 * m + 8 * h;
      _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_mul_ps(_mm256_mul_ps(halves(d + 16 * h), _mm256_set1_ps(da[m])),
                                                                       _mm256_cvtepi32_ps(isum[m][h]))));
    }
}

// Q4_K: per 64-value chunk k the low nibbles are sub-block 2 k and the high ones 2 k + 1 (gguf_blocks.h).
struct Q4K {
  static constexpr int64_t kGroupBlock = 16 * 144, kSide = 2048;
  static constexpr int kMaxRows = 2;  // activation rows a tile holds (AVX2 has 16 registers)

  // Half h's sub-block s scale (Min: its min), get_scale_min_k4 (gguf_blocks.h) in 8 lanes, from the side
  // data's three runs of scale bytes.
  template <bool Min>
  static __m256i get(const uint8_t* side, int h, int s) {
    const __m256i lo = load(side + (Min ? 128 : 64) + 32 * h);
    if (s < 4) return _mm256_and_si256(_mm256_srli_epi32(lo, 8 * s), _mm256_set1_epi32(63));
    const int t = s - 4;
    const __m256i b2 = load(side + 192 + 32 * h);
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(b2, 8 * t + (Min ? 4 : 0)), _mm256_set1_epi32(15)),
                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(lo, 8 * t + 6), _mm256_set1_epi32(3)), 4));
  }

  template <int MB>
  static void tile(const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < 16 * MB; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = g + b * kGroupBlock;
      const uint8_t* side = blk + kSide;
      if constexpr (MB > 1) prefetch_l2<kGroupBlock>(blk);  // one row: the hardware's prefetch keeps up
      const ActK* a[MB];
      __m256i isum[MB][2], msum[MB][2];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        a[m] = reinterpret_cast<const ActK*>(act + m * stride) + b;
        isum[m][0] = isum[m][1] = _mm256_setzero_si256();
      }
      for (int k = 0; k < 4; ++k) {
        __m256i lo[MB][2], hi[MB][2];
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) lo[m][0] = lo[m][1] = hi[m][0] = hi[m][1] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int i = 0; i < 8; ++i) {  // (unrolled further, GCC computes every product first and spills them)
          const __m256i c0 = load(blk + 64 * (8 * k + i)), c1 = load(blk + 64 * (8 * k + i) + 32);
          const __m256i wl0 = _mm256_and_si256(c0, m4), wh0 = _mm256_and_si256(_mm256_srli_epi16(c0, 4), m4);
          const __m256i wl1 = _mm256_and_si256(c1, m4), wh1 = _mm256_and_si256(_mm256_srli_epi16(c1, 4), m4);
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m) {
            const int8_t* q = a[m]->q + 64 * k + 4 * i;
            const __m256i x = bcast(q), y = bcast(q + 32);
            lo[m][0] = _mm256_add_epi16(lo[m][0], _mm256_maddubs_epi16(wl0, x));
            lo[m][1] = _mm256_add_epi16(lo[m][1], _mm256_maddubs_epi16(wl1, x));
            hi[m][0] = _mm256_add_epi16(hi[m][0], _mm256_maddubs_epi16(wh0, y));
            hi[m][1] = _mm256_add_epi16(hi[m][1], _mm256_maddubs_epi16(wh1, y));
          }
        }
        for (int h = 0; h < 2; ++h) {
          const __m256i scale_lo = word_pair(get<false>(side, h, 2 * k)), scale_hi = word_pair(get<false>(side, h, 2 * k + 1));
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m)
            isum[m][h] = _mm256_add_epi32(isum[m][h], _mm256_add_epi32(_mm256_madd_epi16(lo[m][h], scale_lo),
                                                                       _mm256_madd_epi16(hi[m][h], scale_hi)));
        }
      }
      for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) msum[m][h] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m256i pair = _mm256_or_si256(get<true>(side, h, 2 * j), _mm256_slli_epi32(get<true>(side, h, 2 * j + 1), 16));
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m) msum[m][h] = _mm256_add_epi32(msum[m][h], _mm256_madd_epi16(pair, bcast(a[m]->bsum32 + 2 * j)));
        }
        const __m256 d = halves(side + 16 * h), dmin = halves(side + 32 + 16 * h);
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
          float* o = out + 16 * m + 8 * h;
          const __m256 da = _mm256_set1_ps(a[m]->d);
          __m256 acc = _mm256_add_ps(_mm256_loadu_ps(o), _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum[m][h])));
          acc = _mm256_sub_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msum[m][h])));
          _mm256_storeu_ps(o, acc);
        }
      }
    }
  }
};

// IQ4_XS: sub-block j's 16 code bytes are runs 4 j .. 4 j + 3 (low nibbles: values 32 j + 4 c .. + 3, high
// nibbles the same + 16), looked up in kIQ4Values; each register's word pairs widen against the
// sub-block's 6-bit signed scale.
struct IQ4XS {
  static constexpr int64_t kGroupBlock = 16 * 136;
  static constexpr int kMaxRows = 3;

  template <int MB>
  static void tile(const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
    for (int i = 0; i < 16 * MB; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = g + b * kGroupBlock;
      prefetch_l2<kGroupBlock>(blk);
      const ActK* a[MB];
      float da[MB];
      __m256i isum[MB][2];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        a[m] = reinterpret_cast<const ActK*>(act + m * stride) + b;
        da[m] = a[m]->d;
        isum[m][0] = isum[m][1] = _mm256_setzero_si256();
      }
      for (int j = 0; j < 8; ++j) {
        __m256i scale[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {  // iq4xs_scales (gguf_blocks.h) in 8 lanes
          const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2080 + 16 * h)));
          const __m256i sl = load(blk + 2112 + 32 * h);
          scale[h] = word_pair(_mm256_sub_epi32(
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(sl, 4 * j), _mm256_set1_epi32(15)),
                              _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * j), _mm256_set1_epi32(3)), 4)),
              _mm256_set1_epi32(32)));
        }
#pragma GCC unroll 2
        for (int c = 0; c < 8; ++c) {  // c < 4: run 4 j + c's low nibbles; else run 4 j + c - 4's high ones
          __m256i v[2];
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            const __m256i raw = load(blk + 64 * (4 * j + c % 4) + 32 * h);
            v[h] = _mm256_shuffle_epi8(table, _mm256_and_si256(c < 4 ? raw : _mm256_srli_epi16(raw, 4), m4));
          }
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m) {
            const __m256i x = bcast(a[m]->q + 32 * j + 4 * (c % 4) + 16 * (c / 4));
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h)
              isum[m][h] = _mm256_add_epi32(isum[m][h], _mm256_madd_epi16(signed_pairs(v[h], x), scale[h]));
          }
        }
      }
      add_block<MB>(out, blk + 2048, da, isum);
    }
  }
};

// Q8_0 and Q4_0: register k holds values 4 k .. 4 k + 3 of 8 rows (Q4_0: run k's low nibbles for k < 4, run
// k - 4's high nibbles for k >= 4, as in the AVX-512 tile). Q4_0 multiplies its unsigned codes and starts
// from the activations' corr (-128 * the block's sum, read as -8 * it); Q8_0 multiplies its signed values.
template <int64_t Type>
struct Blocks32 {
  static constexpr int64_t kBytes = Type == kQ8_0 ? 34 : 18;
  static constexpr int64_t kGroupBlock = 16 * kBytes, kD = Type == kQ8_0 ? 512 : 256;
  static constexpr int kMaxRows = 4;

  // Register k of half h: 8 rows' 4 values (Q4_0: unsigned codes).
  static __m256i weights(const uint8_t* blk, int k, int h) {
    if constexpr (Type == kQ8_0) return load(blk + 64 * k + 32 * h);
    const __m256i raw = load(blk + 64 * (k % 4) + 32 * h);
    return _mm256_and_si256(k < 4 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
  }

  template <int MB>
  static void tile(const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    for (int i = 0; i < 16 * MB; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = g + b * kGroupBlock;
      prefetch_l2<kGroupBlock>(blk);
      const int parity = static_cast<int>(b & 1);  // which of its Act32's two blocks
      const Act32* a[MB];
      float da[MB];
      __m256i isum[MB][2], words[MB][2];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        a[m] = reinterpret_cast<const Act32*>(act + m * stride) + b / 2;
        da[m] = a[m]->d[8 * parity];
        const int32_t corr = Type == kQ8_0 ? 0 : a[m]->corr[8 * parity] >> 4;
        isum[m][0] = isum[m][1] = _mm256_set1_epi32(corr);
        words[m][0] = words[m][1] = _mm256_setzero_si256();
      }
#pragma GCC unroll 4
      for (int k = 0; k < 8; ++k) {
        const __m256i w0 = weights(blk, k, 0), w1 = weights(blk, k, 1);
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
          const __m256i x = bcast(a[m]->q + 32 * parity + 4 * k);
          if constexpr (Type == kQ8_0) {
            isum[m][0] = _mm256_add_epi32(isum[m][0], widen(signed_pairs(w0, x)));
            isum[m][1] = _mm256_add_epi32(isum[m][1], widen(signed_pairs(w1, x)));
          } else {  // words summed over the 8 registers, then widened
            const __m256i p0 = _mm256_maddubs_epi16(w0, x), p1 = _mm256_maddubs_epi16(w1, x);
            words[m][0] = _mm256_add_epi16(words[m][0], p0);
            words[m][1] = _mm256_add_epi16(words[m][1], p1);
            if (k == 7) {
              isum[m][0] = _mm256_add_epi32(isum[m][0], widen(words[m][0]));
              isum[m][1] = _mm256_add_epi32(isum[m][1], widen(words[m][1]));
            }
          }
        }
      }
      add_block<MB>(out, blk + kD, da, isum);
    }
  }
};

template <class K, int M = K::kMaxRows>
inline void tile_n(int mb, const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
  if constexpr (M > 0) {
    if (mb == M) K::template tile<M>(g, nb, act, stride, out);
    else tile_n<K, M - 1>(mb, g, nb, act, stride, out);
  }
}

// As avx512::run (gguf_avx512_interleaved.cpp): the rows in tiles of sizes that differ by one at most.
template <class K>
void run(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act, int64_t stride,
         int64_t nrows, float* y, int64_t ldy) {
  alignas(32) float out[16 * K::kMaxRows];
  const int64_t tiles = (nrows + K::kMaxRows - 1) / K::kMaxRows;
  for (int64_t g0 = o0 / kGroupRows * kGroupRows; g0 < o1; g0 += kGroupRows) {
    const int64_t lo = std::max(o0, g0), hi = std::min(o1, g0 + kGroupRows);
    for (int64_t t = 0, r = 0; t < tiles; ++t) {
      const int mb = static_cast<int>(nrows / tiles + (t < nrows % tiles ? 1 : 0));
      tile_n<K>(mb, w + g0 * row_bytes, nb, act + r * stride, stride, out);
      for (int m = 0; m < mb; ++m)
        for (int64_t o = lo; o < hi; ++o) y[(r + m) * ldy + o] = out[16 * m + (o - g0)];
      r += mb;
    }
  }
}

}  // namespace

bool has_interleaved(int64_t type) {
  switch (base_type(type)) {
    case kQ4_K: case kIQ4_XS: case kQ8_0: case kQ4_0: return true;
    default: return false;
  }
}

void rows_interleaved(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
                      const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (base_type(type)) {
    case kQ4_K: run<Q4K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kIQ4_XS: run<IQ4XS>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ8_0: run<Blocks32<kQ8_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ4_0: run<Blocks32<kQ4_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
  }
}

}  // namespace avx2
#pragma GCC pop_options
