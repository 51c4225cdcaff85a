// The compiled decoder pass's layer loop (gguf_pass.cpp's opening comment says what a layer does, and why
// its rows stay independent bitwise). The threads enter one OpenMP region per pass and meet at barriers;
// each step below is one thread's share of the step: rows r = t, t + nt, ... for the row-wise steps (the
// same rows in every one, so that no barrier separates two row-wise steps), a slice of the weight bytes for
// the projections, a run of (row, head) units for the rotary embedding and attention.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_kernel.h"
#include "gguf_pass.h"
#include "gguf_pass_kernels.h"

#ifdef SPECWISE_STEP_TIMES
#include <chrono>
// A lab build's step timer (SPECWISE_STEP_TIMES=1; scripts/lab/pass_steps.py reads it): thread 0 adds each
// step's wall time, barrier to barrier, to specwise_step_ns[k], k = 1 .. 11 in the order of Loop::run.
extern "C" {
double specwise_step_ns[16];
}
#endif

namespace specwise_pass {
namespace {

constexpr int kMaxThreads = 64;
constexpr int64_t kAlign = 64;     // the activation buffers' alignment (every layout's rows are multiples of it)
constexpr int64_t kOutputRun = 16;  // a thread's share of a projection starts at a multiple of 16 output rows
constexpr int64_t kSlack = 8;      // scores' floats past a query's entries (Query::scores)

int kind_of(int64_t type) { return specwise_gguf::activation_kind(type); }
int64_t kind_type(int kind) { return specwise_gguf::activation_kind_type(kind); }

class Loop {
 public:
  Loop(const Model& m, const Rows& rows, int64_t path)
      : m_(m), rows_(rows), path_(path), n_(rows.n), H_(m.hidden), d_(m.head_dim), I_(m.intermediate),
        q_size_(m.heads * m.head_dim), qkv_size_(q_size_ + 2 * m.kv_heads * m.head_dim),
        // The path's element-wise and attention kernels (gguf_pass_kernels.h), the SIMD ones where the sizes allow.
        K_(pass_kernels(path, d_ % 8 == 0 && H_ % 8 == 0 && I_ % 8 == 0)),
        scale_(m.attention_scale > 0.f ? m.attention_scale : 1.f / std::sqrt(static_cast<float>(d_))),
        x_(n_ * H_), qkv_(n_ * qkv_size_), attn_(n_ * q_size_), proj_(n_ * H_), gu_(n_ * 2 * I_), mid_(n_ * I_) {
    for (const auto& s : rows.seen) widest_seen_ = std::max<int64_t>(widest_seen_, static_cast<int64_t>(s.size()));
    // One scratch buffer per activation layout, wide enough for any projection's input, each kAlign-aligned.
    const int64_t widest = std::max(H_, std::max(I_, q_size_));
    int64_t most = 0;
    for (int k = 0; k < kKinds; ++k) {
      stride_[k] = specwise_gguf::activation_stride(kind_type(k), (widest + 255) / 256 * 256);
      most = std::max(most, stride_[k]);
    }
    act_buffer_.resize(kKinds * n_ * most + kAlign);
    uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(act_buffer_.data()) + kAlign - 1) &
                                               ~uintptr_t(kAlign - 1));
    for (int k = 0; k < kKinds; ++k) act_[k] = base + k * n_ * most;
  }

  void run(int64_t first, int64_t last) {
    const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), kMaxThreads)));
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      // Scratch for up to kBatch query heads at once (Kernels::attend): their scores and value sums.
      std::vector<float> scores(kBatch * (widest_seen_ + kSlack)), sums(kBatch * d_), rotated(d_);
#ifdef SPECWISE_STEP_TIMES
      auto stamp = std::chrono::steady_clock::now();
      const auto step = [&](int k) {
        if (t != 0) return;
        const auto now = std::chrono::steady_clock::now();
        specwise_step_ns[k] += std::chrono::duration<double, std::nano>(now - stamp).count();
        stamp = now;
      };
#else
      const auto step = [](int) {};
#endif
      for (int64_t l = first; l < last; ++l) {
        const Layer& layer = m_.layers[l];
        for (int64_t r = t; r < n_; r += nt)
          K_.rms_norm(hidden(r), layer.input_norm.data_ptr<float>(), H_, m_.eps, x(r));
        quantize(layer.qkv, x_.data(), t, nt);
#pragma omp barrier
        step(1);
        project(layer.qkv, qkv_.data(), t, nt);
#pragma omp barrier
        step(2);
        rotate(l, layer, t, nt, rotated.data());
#pragma omp barrier
        step(3);
        attend(l, layer, t, nt, scores.data(), sums.data());
#pragma omp barrier
        step(4);
        quantize(layer.o, attn_.data(), t, nt);
#pragma omp barrier
        step(5);
        project(layer.o, proj_.data(), t, nt);
#pragma omp barrier
        step(6);
        for (int64_t r = t; r < n_; r += nt) {
          add_residual(r, layer.attn_out_norm);
          K_.rms_norm(hidden(r), layer.post_norm.data_ptr<float>(), H_, m_.eps, x(r));
        }
        quantize(layer.gate_up, x_.data(), t, nt);
#pragma omp barrier
        step(7);
        project(layer.gate_up, gu_.data(), t, nt);
#pragma omp barrier
        step(8);
        const auto activate = m_.activation == kGeluTanh ? K_.gelu_tanh_mul : K_.silu_mul;
        for (int64_t r = t; r < n_; r += nt) {
          const float* g = gu_.data() + r * 2 * I_;  // [gate | up]
          activate(g, g + I_, I_, mid_.data() + r * I_);
        }
        step(9);  // thread 0's rows only: the activation has no barrier of its own
        quantize(layer.down, mid_.data(), t, nt);
#pragma omp barrier
        step(10);
        project(layer.down, proj_.data(), t, nt);
#pragma omp barrier
        step(11);
        // The same thread handles row r in every row-wise step, so the next layer's norm needs no barrier.
        for (int64_t r = t; r < n_; r += nt) {
          add_residual(r, layer.mlp_out_norm);
          if (rows_.capture_at[l] >= 0)
            std::memcpy(rows_.captured + (r * rows_.captures + rows_.capture_at[l]) * H_, hidden(r), H_ * 4);
        }
      }
    }
  }

 private:
  float* hidden(int64_t r) const { return rows_.hidden + r * H_; }
  float* x(int64_t r) { return x_.data() + r * H_; }

  // Row r's residual: hidden += the step's output (proj), normalized first where the layer has that norm
  // (Gemma's outputs), into x's row.
  void add_residual(int64_t r, const torch::Tensor& norm) {
    float* h = hidden(r);
    const float* add = proj_.data() + r * H_;
    if (norm.defined()) {
      K_.rms_norm(add, norm.data_ptr<float>(), H_, m_.eps, x(r));
      add = x(r);
    }
    for (int64_t i = 0; i < H_; ++i) h[i] += add[i];
  }

  // Quantize rows r (this thread's: r = t, t + nt, ...) of src [n, in] for every layout the projection reads.
  void quantize(const Proj& p, const float* src, int t, int nt) {
    for (int64_t r = t; r < n_; r += nt)
      for (int k = 0; k < kKinds; ++k)
        if (p.kinds[k]) specwise_gguf::quantize_rows_serial(path_, kind_type(k), src, r, r + 1, p.in, act_[k], stride_[k]);
  }

  // This thread's share of the projection's outputs, split by weight bytes in runs of kOutputRun rows.
  void project(const Proj& p, float* y, int t, int nt) {
    const int64_t lo_bytes = p.bytes * t / nt, hi_bytes = p.bytes * (t + 1) / nt;
    int64_t offset = 0, before = 0;
    for (const Part& part : p.parts) {
      auto first = [&](int64_t target) {  // the part's first row at or after `target` bytes, rounded up to a run
        if (target <= before) return int64_t{0};
        const int64_t row = (target - before + part.row_bytes - 1) / part.row_bytes;
        return std::min(part.out, (row + kOutputRun - 1) / kOutputRun * kOutputRun);
      };
      const int64_t o0 = first(lo_bytes), o1 = t == nt - 1 ? part.out : first(hi_bytes);
      const uint8_t* wp = part.weight.data_ptr<uint8_t>();
      const int k = kind_of(part.type);
      if (o1 > o0) {
        specwise_gguf::dot_rows(path_, part.type, wp, part.row_bytes, o0, o1, part.nb, act_[k], stride_[k], n_,
                                y + offset, p.out);
        if (part.bias.defined()) {
          const float* b = part.bias.data_ptr<float>();
          for (int64_t r = 0; r < n_; ++r)
            for (int64_t o = o0; o < o1; ++o) y[r * p.out + offset + o] += b[o];
        }
      }
      offset += part.out;
      before += part.out * part.row_bytes;
    }
  }

  // Rotary embedding of q (in place) and k (into the cache); v into the cache. Units: (row, head).
  void rotate(int64_t l, const Layer& layer, int t, int nt, float* rotated) {
    const int64_t heads = m_.heads, kv_heads = m_.kv_heads, d = d_, n = n_;
    for (int64_t u = t; u < n * (heads + 2 * kv_heads); u += nt) {
      const int64_t r = u / (heads + 2 * kv_heads), h = u % (heads + 2 * kv_heads);
      float* src = qkv_.data() + r * qkv_size_ + h * d;
      const RowCache& c = rows_.caches[r];
      if (h >= heads + kv_heads) {
        std::memcpy(c.values + ((l * kv_heads + (h - heads - kv_heads)) * c.capacity + c.slot) * d, src, d * 4);
        continue;
      }
      if (layer.q_norm.defined()) {  // RMSNorm of the head, in place, before the rotary embedding
        const float* w = (h < heads ? layer.q_norm : layer.k_norm).data_ptr<float>();
        K_.rms_norm(src, w, d, m_.eps, src);
      }
      const float *co = rows_.cos + (layer.rope * n + r) * d, *si = rows_.sin + (layer.rope * n + r) * d;
      const int64_t half = d / 2;
      for (int64_t i = 0; i < half; ++i) rotated[i] = src[i] * co[i] - src[i + half] * si[i];
      for (int64_t i = half; i < d; ++i) rotated[i] = src[i] * co[i] + src[i - half] * si[i];
      float* dst = h < heads ? src : c.keys + ((l * kv_heads + (h - heads)) * c.capacity + c.slot) * d;
      std::memcpy(dst, rotated, d * 4);
    }
  }

  // Each thread a run of (row, head) units taken kv head by kv head (all rows' heads of kv head 0, then of kv
  // head 1, ...), so that a thread reads the cache entries of as few kv heads as it can and each kv head's
  // entries are read by as few threads. A thread's units of one kv head and one cache go in batches through
  // K.attend, which (on the SIMD paths) reads each entry once for all of them.
  void attend(int64_t l, const Layer& layer, int t, int nt, float* scores, float* sums) {
    const int64_t kv_heads = m_.kv_heads, d = d_, n = n_, group = m_.heads / m_.kv_heads;
    const int64_t u_lo = n * m_.heads * t / nt, u_hi = n * m_.heads * (t + 1) / nt;
    Query batch[kBatch];
    int nq = 0;
    const RowCache* owner = nullptr;
    int64_t kv = 0;
    auto flush = [&]() {
      if (nq == 0) return;
      K_.attend(batch, nq, owner->keys + (l * kv_heads + kv) * owner->capacity * d,
                owner->values + (l * kv_heads + kv) * owner->capacity * d, d, scale_, m_.softcap);
      nq = 0;
    };
    for (int64_t v = u_lo; v < u_hi; ++v) {  // v = (g * n + r) * group + (h - g * group)
      const int64_t g = v / (n * group), r = v / group % n, h = g * group + v % group;
      const RowCache* c = &rows_.caches[r];
      // A row's visible entries hold one position each, up to its own, in cache order: a sliding window
      // keeps the last `window` of them.
      const auto& all = rows_.seen[r];
      const int64_t visible = static_cast<int64_t>(all.size());
      const int64_t count = layer.window > 0 ? std::min(visible, layer.window) : visible;
      const int32_t* entries = all.data() + (visible - count);
      const float* query = qkv_.data() + r * qkv_size_ + h * d;
      float* out = attn_.data() + r * q_size_ + h * d;
      if (nq == kBatch || (nq > 0 && (g != kv || c->keys != owner->keys || c->capacity != owner->capacity)))
        flush();
      owner = c;
      kv = g;
      batch[nq] = {query, entries, count, scores + nq * (widest_seen_ + kSlack), sums + nq * d, out, 0.f, 0.f};
      ++nq;
    }
    flush();
  }

  const Model& m_;
  const Rows& rows_;
  const int64_t path_, n_, H_, d_, I_, q_size_, qkv_size_;
  const Kernels& K_;
  const float scale_;
  int64_t widest_seen_ = 0;
  std::vector<float> x_, qkv_, attn_, proj_, gu_, mid_;  // [n, hidden], [n, q + 2 kv], ... per row
  int64_t stride_[kKinds] = {};
  std::vector<uint8_t> act_buffer_;
  uint8_t* act_[kKinds] = {};
};

}  // namespace

void run_layers(const Model& model, const Rows& rows, int64_t first, int64_t last, int64_t path) {
  Loop(model, rows, path).run(first, last);
}

}  // namespace specwise_pass
