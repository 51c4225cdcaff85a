// The AVX2 tiles of the interleaved layout (gguf_interleaved.h): Q4_K, Q6_K, IQ4_XS and the 32-value Q8_0,
// Q4_0, Q5_0 (Q5_K's groups are read back into stored blocks). A group's 16 rows are two halves of 8 lanes
// (rows 0-7 in the first 32 bytes of each 64-byte run, rows 8-15 in the second), each half a tile of its
// own over the block while it is in L1. Without VNNI an activation row's 4 codes, broadcast, meet 8 rows'
// 4 codes in vpmaddubsw (unsigned weight codes times signed activations, pairs summed into words) and the
// words reach 32 bits in one vpmaddwd, against the sub-block's scale as a pair of words where the format
// has one (so the scale costs no vpmulld). The word sums are bounded so that nothing saturates:
//   Q4_K, Q4_0: codes 0-15, |a| <= 127: a pair <= 3810, eight pairs summed <= 30480;
//   Q5_0: codes 0-31: a pair <= 7874, four summed <= 31496;
//   Q6_K: codes 0-63: a pair <= 16002, two summed <= 32004;
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

constexpr int kMaxRows = 4;  // activation rows a tile holds

inline __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// The 4 bytes at p in every dword (a vpbroadcastd from memory).
inline __m256i bcast(const uint8_t* p) { return _mm256_set1_epi32(static_cast<int>(load_u32(p))); }
// 8 fp16 at p as floats.
inline __m256 halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// A small signed integer per dword as the same value in both its words (vpmaddwd's other operand).
inline __m256i word_pair(__m256i v) { return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16)); }
// Word pairs summed into dwords.
inline __m256i widen(__m256i words) { return _mm256_madd_epi16(words, _mm256_set1_epi16(1)); }

// The group block kAhead bytes ahead into L2, as the AVX-512 tiles do (gguf_avx512_interleaved.cpp).
constexpr int64_t kAhead = 16384;
template <int64_t Bytes>
inline void prefetch_l2(const uint8_t* blk) {
  for (int64_t o = 0; o < Bytes; o += 64) __builtin_prefetch(blk + kAhead + o, 0, 2);
}

// out[16 m + 8 h + r] += (d * da_m) * isum[m] (the scalar path's float step), rows 8 h .. 8 h + 7.
template <int MB>
inline void add_block(float* out, int h, __m256 d, const ActK* const* a, const __m256i* isum) {
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) {
    float* o = out + 16 * m + 8 * h;
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(a[m]->d)),
                                                                     _mm256_cvtepi32_ps(isum[m]))));
  }
}

// Q4_K: per 64-value chunk k the low nibbles are sub-block 2 k and the high ones 2 k + 1 (gguf_blocks.h).
struct Q4K {
  static constexpr int64_t kGroupBlock = 16 * 144, kSide = 2048;

  template <int MB>
  static void tile(const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), six = _mm256_set1_epi32(63);
    for (int i = 0; i < 16 * MB; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = g + b * kGroupBlock;
      if constexpr (MB > 1) prefetch_l2<kGroupBlock>(blk);
      const ActK* a[MB];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) a[m] = reinterpret_cast<const ActK*>(act + m * stride) + b;
      for (int h = 0; h < 2; ++h) {
        const uint8_t* side = blk + kSide;
        const __m256i b0 = load(side + 64 + 32 * h), b1 = load(side + 128 + 32 * h), b2 = load(side + 192 + 32 * h);
        // Sub-block s's scale (Min: its min), get_scale_min_k4 (gguf_blocks.h) in 8 lanes.
        const auto get = [&](int s, bool min) {
          const __m256i lo = min ? b1 : b0;
          if (s < 4) return _mm256_and_si256(_mm256_srli_epi32(lo, 8 * s), six);
          const int t = s - 4;
          return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(b2, 8 * t + (min ? 4 : 0)), _mm256_set1_epi32(15)),
                                 _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(lo, 8 * t + 6), _mm256_set1_epi32(3)), 4));
        };
        __m256i isum[MB], msum[MB];
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) isum[m] = msum[m] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          __m256i lo[MB], hi[MB];
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m) lo[m] = hi[m] = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i) {
            const __m256i c = load(blk + 64 * (8 * k + i) + 32 * h);
            const __m256i wl = _mm256_and_si256(c, m4), wh = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
#pragma GCC unroll 8
            for (int m = 0; m < MB; ++m) {
              const uint8_t* q = reinterpret_cast<const uint8_t*>(a[m]->q) + 64 * k + 4 * i;
              lo[m] = _mm256_add_epi16(lo[m], _mm256_maddubs_epi16(wl, bcast(q)));
              hi[m] = _mm256_add_epi16(hi[m], _mm256_maddubs_epi16(wh, bcast(q + 32)));
            }
          }
          const __m256i scale_lo = word_pair(get(2 * k, false)), scale_hi = word_pair(get(2 * k + 1, false));
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m)
            isum[m] = _mm256_add_epi32(isum[m], _mm256_add_epi32(_mm256_madd_epi16(lo[m], scale_lo),
                                                                 _mm256_madd_epi16(hi[m], scale_hi)));
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m256i pair = _mm256_or_si256(get(2 * j, true), _mm256_slli_epi32(get(2 * j + 1, true), 16));
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m)
            msum[m] = _mm256_add_epi32(msum[m], _mm256_madd_epi16(pair, bcast(reinterpret_cast<const uint8_t*>(a[m]->bsum32) + 4 * j)));
        }
        const __m256 d = halves(side + 16 * h), dmin = halves(side + 32 + 16 * h);
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
          float* o = out + 16 * m + 8 * h;
          const __m256 da = _mm256_set1_ps(a[m]->d);
          __m256 acc = _mm256_add_ps(_mm256_loadu_ps(o), _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum[m])));
          acc = _mm256_sub_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msum[m])));
          _mm256_storeu_ps(o, acc);
        }
      }
    }
  }
};

// Q6_K: value 128 j2 + 32 j + l as in the AVX-512 tile (gguf_blocks.h, q6k_value); a sub-block's 16 values
// are 4 registers, summed in words two at a time, then widened against its int8 scale; the offset of 32
// is 32 * sum_g scale_g * bsum16_g, over word pairs of scales.
struct Q6K {
  static constexpr int64_t kGroupBlock = 16 * 210;

  template <int MB>
  static void tile(const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
    for (int i = 0; i < 16 * MB; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = g + b * kGroupBlock;
      prefetch_l2<kGroupBlock>(blk);
      const ActK* a[MB];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) a[m] = reinterpret_cast<const ActK*>(act + m * stride) + b;
      for (int h = 0; h < 2; ++h) {
        __m256i total[MB];
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) total[m] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int j2 = 0; j2 < 2; ++j2) {
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 2
            for (int u = 0; u < 2; ++u) {
              const int s = 8 * j2 + 2 * j + u;
              const __m256i scale = word_pair(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 3072 + 16 * s + 8 * h))));
              __m256i w[4];
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i) {
                const int l = 16 * u + 4 * i;
                const __m256i ql = load(blk + 64 * ((64 * j2 + 32 * (j & 1) + l) / 4) + 32 * h);
                const __m256i qh = load(blk + 2048 + 64 * ((32 * j2 + l) / 4) + 32 * h);
                const __m256i lo = j < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), m3);
                w[i] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
              }
#pragma GCC unroll 8
              for (int m = 0; m < MB; ++m) {
                const uint8_t* q = reinterpret_cast<const uint8_t*>(a[m]->q) + 128 * j2 + 32 * j + 16 * u;
                const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], bcast(q)), _mm256_maddubs_epi16(w[1], bcast(q + 4)));
                const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], bcast(q + 8)), _mm256_maddubs_epi16(w[3], bcast(q + 12)));
                total[m] = _mm256_add_epi32(total[m], _mm256_add_epi32(_mm256_madd_epi16(p01, scale), _mm256_madd_epi16(p23, scale)));
              }
            }
          }
        }
        __m256i pairs[8];
#pragma GCC unroll 8
        for (int p = 0; p < 8; ++p) {
          const uint8_t* sc = blk + 3072 + 32 * p + 8 * h;
          const __m256i even = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
          const __m256i odd = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16)));
          pairs[p] = _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(odd, 16));
        }
        __m256i isum[MB];
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
          const uint8_t* bs = reinterpret_cast<const uint8_t*>(a[m]->bsum16);
          __m256i offset = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int p = 0; p < 8; ++p) offset = _mm256_add_epi32(offset, _mm256_madd_epi16(pairs[p], bcast(bs + 4 * p)));
          isum[m] = _mm256_sub_epi32(total[m], _mm256_slli_epi32(offset, 5));
        }
        add_block<MB>(out, h, halves(blk + 3328 + 16 * h), a, isum);
      }
    }
  }
};

// The magnitudes of signed weight bytes against the activations carrying their signs: 4 products per
// dword, in word pairs (each pair <= 2 * 128 * 127).
inline __m256i signed_pairs(__m256i v, __m256i x) { return _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x, v)); }

// IQ4_XS: sub-block j's 16 code bytes are runs 4 j .. 4 j + 3 (low nibbles: values 32 j + 4 c .. + 3, high
// nibbles the same + 16), looked up in kIQ4Values; each register's word pairs widen against the
// sub-block's 6-bit signed scale.
struct IQ4XS {
  static constexpr int64_t kGroupBlock = 16 * 136;

  template <int MB>
  static void tile(const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
    for (int i = 0; i < 16 * MB; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = g + b * kGroupBlock;
      prefetch_l2<kGroupBlock>(blk);
      const ActK* a[MB];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) a[m] = reinterpret_cast<const ActK*>(act + m * stride) + b;
      for (int h = 0; h < 2; ++h) {
        const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2080 + 16 * h)));
        const __m256i sl = load(blk + 2112 + 32 * h);
        __m256i isum[MB];
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) isum[m] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {  // iq4xs_scales (gguf_blocks.h) in 8 lanes
          const __m256i scale = word_pair(_mm256_sub_epi32(
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(sl, 4 * j), _mm256_set1_epi32(15)),
                              _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * j), _mm256_set1_epi32(3)), 4)),
              _mm256_set1_epi32(32)));
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) {
            const __m256i raw = load(blk + 64 * (4 * j + c) + 32 * h);
            const __m256i vl = _mm256_shuffle_epi8(table, _mm256_and_si256(raw, m4));
            const __m256i vh = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
#pragma GCC unroll 8
            for (int m = 0; m < MB; ++m) {
              const uint8_t* q = reinterpret_cast<const uint8_t*>(a[m]->q) + 32 * j + 4 * c;
              isum[m] = _mm256_add_epi32(isum[m], _mm256_add_epi32(_mm256_madd_epi16(signed_pairs(vl, bcast(q)), scale),
                                                                   _mm256_madd_epi16(signed_pairs(vh, bcast(q + 16)), scale)));
            }
          }
        }
        add_block<MB>(out, h, halves(blk + 2048 + 16 * h), a, isum);
      }
    }
  }
};

// The 32-value types (Q8_0, Q4_0, Q5_0): register k holds values 4 k .. 4 k + 3 of 8 rows (Q4_0 and Q5_0: run
// k's low nibbles for k < 4, run k - 4's high nibbles for k >= 4, as in the AVX-512 tile). Q4_0 and Q5_0
// multiply their unsigned codes and start from the activations' corr (-offset * the block's sum; Q4_0 reads
// 128's as 8's); Q8_0 multiplies its signed values, starting from 0.
template <int64_t Type>
struct Blocks32 {
  static constexpr int64_t kBytes = Type == kQ8_0 ? 34 : Type == kQ5_0 ? 22 : 18;
  static constexpr int64_t kGroupBlock = 16 * kBytes, kD = Type == kQ8_0 ? 512 : Type == kQ5_0 ? 320 : 256;

  // Bits 0-3 of each dword lane to bit 4 of its bytes 0-3 (a fifth bit per value).
  static __m256i spread(__m256i nibble) {
    return _mm256_slli_epi32(_mm256_and_si256(_mm256_mullo_epi32(nibble, _mm256_set1_epi32(0x00204081)),
                                              _mm256_set1_epi32(0x01010101)), 4);
  }

  template <int MB>
  static void tile(const uint8_t* g, int64_t nb, const uint8_t* act, int64_t stride, float* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < 16 * MB; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = g + b * kGroupBlock;
      prefetch_l2<kGroupBlock>(blk);
      const int parity = static_cast<int>(b & 1);  // which of its Act32's two blocks
      const Act32* a[MB];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) a[m] = reinterpret_cast<const Act32*>(act + m * stride) + b / 2;
      for (int h = 0; h < 2; ++h) {
        __m256i isum[MB];
        if constexpr (Type == kQ8_0) {
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m) isum[m] = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) {
            const __m256i v = load(blk + 64 * k + 32 * h);
#pragma GCC unroll 8
            for (int m = 0; m < MB; ++m)
              isum[m] = _mm256_add_epi32(isum[m], widen(signed_pairs(v, bcast(reinterpret_cast<const uint8_t*>(a[m]->q) + 32 * parity + 4 * k))));
          }
        } else {
          __m256i w[8];
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) {
            const __m256i raw = load(blk + 64 * c + 32 * h);
            w[c] = _mm256_and_si256(raw, m4);
            w[4 + c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
          }
          if constexpr (Type == kQ5_0) {
            const __m256i qh = load(blk + 256 + 32 * h), f = _mm256_set1_epi32(15);
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
              w[c] = _mm256_or_si256(w[c], spread(_mm256_and_si256(_mm256_srli_epi32(qh, 4 * c), f)));
              w[4 + c] = _mm256_or_si256(w[4 + c], spread(_mm256_and_si256(_mm256_srli_epi32(qh, 16 + 4 * c), f)));
            }
          }
#pragma GCC unroll 8
          for (int m = 0; m < MB; ++m) {
            const uint8_t* q = reinterpret_cast<const uint8_t*>(a[m]->q) + 32 * parity;
            const auto words = [&](int k0, int n) {  // registers k0 .. k0 + n - 1, summed in words
              __m256i s = _mm256_maddubs_epi16(w[k0], bcast(q + 4 * k0));
              for (int k = k0 + 1; k < k0 + n; ++k) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[k], bcast(q + 4 * k)));
              return s;
            };
            const __m256i corr = _mm256_set1_epi32(Type == kQ4_0 ? a[m]->corr[8 * parity] >> 4 : a[m]->corr[8 * parity]);
            isum[m] = Type == kQ4_0 ? _mm256_add_epi32(corr, widen(words(0, 8)))
                                    : _mm256_add_epi32(corr, _mm256_add_epi32(widen(words(0, 4)), widen(words(4, 4))));
          }
        }
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
          float* o = out + 16 * m + 8 * h;
          const __m256 scale = _mm256_mul_ps(halves(blk + kD + 16 * h), _mm256_set1_ps(a[m]->d[8 * parity]));
          _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum[m]))));
        }
      }
    }
  }
};

template <class K, int M = kMaxRows>
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
  alignas(32) float out[16 * kMaxRows];
  const int64_t tiles = (nrows + kMaxRows - 1) / kMaxRows;
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
    case kQ4_K: case kQ6_K: case kIQ4_XS: case kQ8_0: case kQ4_0: case kQ5_0: return true;
    default: return false;
  }
}

void rows_interleaved(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
                      const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  switch (base_type(type)) {
    case kQ4_K: run<Q4K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ6_K: run<Q6K>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kIQ4_XS: run<IQ4XS>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ8_0: run<Blocks32<kQ8_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ4_0: run<Blocks32<kQ4_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
    case kQ5_0: run<Blocks32<kQ5_0>>(w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy); break;
  }
}

}  // namespace avx2
#pragma GCC pop_options
