// One decoding pass through every decoder layer of a GGUF model (specwise/runners/architectures.py), in one call.
//
// Why: a pass over a few rows costs ~30 ms of weight reading on two cores, but run as ~20 PyTorch ops and
// 4 kernel calls per layer it also pays several milliseconds of dispatch, allocation and thread wake-ups
// (docs/DESIGN.md, "Cost model"). Here the threads enter one OpenMP region per pass and meet at barriers.
//
// What, per layer: RMSNorm, the fused q/k/v projection (+ bias), [RMSNorm of each q and k head,] rotary
// embedding (the layer's table), the cache write, attention (the model's scale, [soft-capped scores,] [the
// layer's sliding window]), the output projection, [RMSNorm,] the residual, RMSNorm, the fused gate/up
// projection, SiLU(gate) * up or GELU-tanh(gate) * up, the down projection, [RMSNorm,] the residual. The
// bracketed steps are an architecture's (Qwen3, Gemma 2/3); a Llama/Qwen2 layer runs without them, exactly
// as it always has. The projections are the kernel's tiles (gguf_avx512.cpp, gguf_avx2.cpp,
// gguf_scalar.cpp) on the same int8 activations, so they give the same values as gguf_linear; the norms,
// activations and attention are the path's table of gguf_pass_kernels.h (gguf_pass_scalar.cpp,
// gguf_pass_avx2.cpp, gguf_pass_avx512.cpp), chosen once per pass.
//
// This file: the module's DecoderPass (its layers, the checks of each call's arguments) and the choice of
// kernel table; gguf_pass_layers.cpp runs the layers (gguf_pass.h is what passes between the two).
//
// Row independence (docs/DESIGN.md, "Numerics"): every row goes through the same operations in the same
// order whatever the other rows of the pass: norms, rotary and SiLU per row; each (row, head) attends to
// exactly the cache entries its row may see, in cache order, with fixed-order sums; threads split output
// features, heads and rows, never one sum. So a row's hidden states, and its logits, are bit-identical
// to a pass holding that row alone: what makes speculative output equal plain decoding token for token.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gguf_kernel.h"
#include "gguf_pass.h"
#include "gguf_pass_kernels.h"
#include "gguf_paths.h"

namespace {

using specwise_gguf::block_bytes;
using specwise_gguf::block_values;

using specwise_pass::kBatch;  // query heads per attend call
using specwise_pass::kGeluTanh;
using specwise_pass::kSilu;
using specwise_pass::Layer;
using specwise_pass::Part;
using specwise_pass::Proj;
using specwise_pass::Query;
using specwise_pass::RowCache;

Proj make_proj(const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& parts) {
  TORCH_CHECK(!parts.empty(), "a projection needs at least one weight");
  Proj p;
  for (const auto& [weight, type, out, in, bias] : parts) {
    TORCH_CHECK(block_bytes(type) > 0, "ggml type ", type, " is not supported");
    TORCH_CHECK(p.in == 0 || p.in == in, "the weights of one projection must read one input size");
    TORCH_CHECK(in % block_values(type) == 0, "in_features must be a multiple of the block size");
    const int64_t nb = in / block_values(type), row_bytes = nb * block_bytes(type);
    TORCH_CHECK(weight.scalar_type() == torch::kByte && weight.is_contiguous() && weight.numel() == out * row_bytes,
                "weight bytes do not match a [", out, ", ", in, "] tensor");
    Part part{weight, torch::Tensor(), type, out, row_bytes, nb};
    if (bias.has_value()) {
      TORCH_CHECK(bias->numel() == out, "a bias must have one value per output");
      part.bias = bias->to(torch::kFloat).contiguous();
    }
    p.in = in;
    p.out += out;
    p.bytes += out * row_bytes;
    p.kinds[specwise_gguf::activation_kind(type)] = true;
    p.parts.push_back(std::move(part));
  }
  return p;
}

class Pass {
 public:
  // activation: Activation; attention_scale: multiplies q . k (0: 1 / sqrt(head_dim)); softcap: > 0 caps the
  // scores at cap * tanh(score / cap).
  Pass(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate, double eps,
       int64_t activation, double attention_scale, double softcap)
      : model_{hidden, heads, kv_heads, head_dim, intermediate, static_cast<float>(eps), activation,
               static_cast<float>(attention_scale), static_cast<float>(softcap), {}} {
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads must be a multiple of kv_heads");
    TORCH_CHECK(head_dim % 2 == 0, "head_dim must be even");
    TORCH_CHECK(activation == kSilu || activation == kGeluTanh, "activation must be 0 (SiLU) or 1 (GELU-tanh)");
    TORCH_CHECK(attention_scale >= 0 && softcap >= 0, "attention_scale and softcap must not be negative");
  }

  void add_layer(torch::Tensor input_norm, const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& qkv,
                 const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& o,
                 torch::Tensor post_norm,
                 const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& gate_up,
                 const std::vector<std::tuple<torch::Tensor, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>>>& down,
                 const c10::optional<torch::Tensor>& q_norm, const c10::optional<torch::Tensor>& k_norm,
                 const c10::optional<torch::Tensor>& attn_out_norm, const c10::optional<torch::Tensor>& mlp_out_norm,
                 int64_t window, int64_t rope) {
    Layer l{input_norm.to(torch::kFloat).contiguous(), post_norm.to(torch::kFloat).contiguous(), make_proj(qkv),
            make_proj(o), make_proj(gate_up), make_proj(down)};
    auto norm = [](const c10::optional<torch::Tensor>& w, int64_t size, const char* what) {
      if (!w.has_value()) return torch::Tensor();
      TORCH_CHECK(w->numel() == size, what, " must have ", size, " values");
      return w->to(torch::kFloat).contiguous();
    };
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q and k norms come together");
    l.q_norm = norm(q_norm, model_.head_dim, "q_norm");
    l.k_norm = norm(k_norm, model_.head_dim, "k_norm");
    l.attn_out_norm = norm(attn_out_norm, model_.hidden, "attn_out_norm");
    l.mlp_out_norm = norm(mlp_out_norm, model_.hidden, "mlp_out_norm");
    TORCH_CHECK(window >= 0 && rope >= 0, "window and rope must not be negative");
    l.window = window;
    l.rope = rope;
    const int64_t q = model_.heads * model_.head_dim, kv = model_.kv_heads * model_.head_dim;
    TORCH_CHECK(l.input_norm.numel() == model_.hidden && l.post_norm.numel() == model_.hidden, "norm weights must have ", model_.hidden,
                " values");
    TORCH_CHECK(l.qkv.in == model_.hidden && l.qkv.out == q + 2 * kv, "q/k/v must map ", model_.hidden, " to ", q + 2 * kv);
    TORCH_CHECK(l.o.in == q && l.o.out == model_.hidden, "o_proj must map ", q, " to ", model_.hidden);
    TORCH_CHECK(l.gate_up.in == model_.hidden && l.gate_up.out == 2 * model_.intermediate, "gate/up must map ", model_.hidden, " to ",
                2 * model_.intermediate);
    TORCH_CHECK(l.down.in == model_.intermediate && l.down.out == model_.hidden, "down_proj must map ", model_.intermediate, " to ",
                model_.hidden);
    model_.layers.push_back(std::move(l));
  }

  int64_t num_layers() const { return static_cast<int64_t>(model_.layers.size()); }

  // hidden [n, hidden] float32, updated in place. keys/values [layers, kv_heads, capacity, head_dim] float32:
  // the pass writes its rows' entries at slots start..start+n-1. cos/sin [n, head_dim]: each row's rotary
  // factors. visible [n, start + n] bool, or none: row i sees slots 0..start+i. capture: the layers whose
  // outputs go to captured [n, len(capture), hidden]. first, last: the layers [first, last) to run (last -1:
  // through the last layer); hidden is then the output of layer first - 1 and becomes that of layer last - 1,
  // and only those layers' entries are written. Each layer's arithmetic is the same whatever the range, so a
  // range [0, E) then [E, L) gives bitwise what [0, L) gives.
  void run(torch::Tensor hidden, torch::Tensor keys, torch::Tensor values, int64_t start, torch::Tensor cos,
           torch::Tensor sin, const c10::optional<torch::Tensor>& visible, const std::vector<int64_t>& capture,
           const c10::optional<torch::Tensor>& captured, const std::string& path_name, int64_t first, int64_t last) {
    const int64_t n = hidden.size(0), end = start + n;
    check_cache(keys, end);
    check_cache(values, end);
    // The cache slots each row attends to, in cache order.
    std::vector<std::vector<int32_t>> seen(n);
    if (visible.has_value()) {
      const auto vis = visible->to(torch::kBool).contiguous();
      TORCH_CHECK(vis.dim() == 2 && vis.size(0) == n && vis.size(1) >= end, "visible must be [n, start + n]");
      const bool* vp = vis.data_ptr<bool>();
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < end; ++j)
          if (vp[i * vis.size(1) + j]) seen[i].push_back(static_cast<int32_t>(j));
    } else {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j <= start + i; ++j) seen[i].push_back(static_cast<int32_t>(j));
    }
    std::vector<RowCache> where_to(n);
    for (int64_t i = 0; i < n; ++i)
      where_to[i] = {keys.data_ptr<float>(), values.data_ptr<float>(), keys.size(2), start + i};
    execute(hidden, where_to, seen, cos, sin, capture, captured, path_name, first, last);
  }

  // The rows of several sequences in one pass (continuous batching). caches: each sequence's (keys, values),
  // laid out as in run(). Row i belongs to sequence owner[i], writes its entries at slot slots[i] of that
  // sequence's cache and attends to the slots seen_index[seen_offsets[i]:seen_offsets[i + 1]] (ascending) of
  // it. A row computes exactly what run() computes for it in a pass of its own sequence alone.
  void run_ragged(torch::Tensor hidden, const std::vector<std::pair<torch::Tensor, torch::Tensor>>& caches,
                  torch::Tensor owner, torch::Tensor slots, torch::Tensor seen_offsets, torch::Tensor seen_index,
                  torch::Tensor cos, torch::Tensor sin, const std::vector<int64_t>& capture,
                  const c10::optional<torch::Tensor>& captured, const std::string& path_name) {
    const int64_t n = hidden.size(0);
    for (const auto* t : {&owner, &slots, &seen_offsets})
      TORCH_CHECK(t->scalar_type() == torch::kLong && t->dim() == 1 && t->is_contiguous(),
                  "owner, slots and seen_offsets must be contiguous int64 vectors");
    TORCH_CHECK(seen_index.scalar_type() == torch::kInt && seen_index.dim() == 1 && seen_index.is_contiguous(),
                "seen_index must be a contiguous int32 vector");
    TORCH_CHECK(owner.size(0) == n && slots.size(0) == n && seen_offsets.size(0) == n + 1,
                "owner and slots need one entry per row, seen_offsets n + 1");
    const int64_t *op = owner.data_ptr<int64_t>(), *sp = slots.data_ptr<int64_t>(), *fp = seen_offsets.data_ptr<int64_t>();
    const int32_t* ip = seen_index.data_ptr<int32_t>();
    TORCH_CHECK(fp[0] == 0 && fp[n] == seen_index.size(0), "seen_offsets must run from 0 to len(seen_index)");
    std::vector<RowCache> where_to(n);
    std::vector<std::vector<int32_t>> seen(n);
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(op[i] >= 0 && op[i] < static_cast<int64_t>(caches.size()), "row ", i, " names no cache");
      const auto& [keys, values] = caches[op[i]];
      const int64_t capacity = keys.size(2);
      TORCH_CHECK(sp[i] >= 0 && sp[i] < capacity, "row ", i, " writes outside its cache");
      check_cache(keys, sp[i] + 1);
      check_cache(values, sp[i] + 1);
      TORCH_CHECK(fp[i + 1] >= fp[i], "seen_offsets must not decrease");
      for (int64_t j = fp[i]; j < fp[i + 1]; ++j) {
        TORCH_CHECK(ip[j] >= 0 && ip[j] < capacity && (j == fp[i] || ip[j] > ip[j - 1]),
                    "row ", i, " must see ascending slots inside its cache");
        seen[i].push_back(ip[j]);
      }
      where_to[i] = {keys.data_ptr<float>(), values.data_ptr<float>(), capacity, sp[i]};
    }
    execute(hidden, where_to, seen, cos, sin, capture, captured, path_name, 0, -1);
  }

 private:
  void check_cache(const torch::Tensor& t, int64_t end) const {
    TORCH_CHECK(t.scalar_type() == torch::kFloat && t.is_contiguous() && t.dim() == 4 && t.size(0) == num_layers() &&
                    t.size(1) == model_.kv_heads && t.size(3) == model_.head_dim && t.size(2) >= end,
                "the cache must be contiguous float32 [", num_layers(), ", ", model_.kv_heads, ", >= ", end, ", ",
                model_.head_dim, "]");
  }

  void execute(torch::Tensor hidden, const std::vector<RowCache>& where_to,
               const std::vector<std::vector<int32_t>>& seen, torch::Tensor cos, torch::Tensor sin,
               const std::vector<int64_t>& capture, const c10::optional<torch::Tensor>& captured,
               const std::string& path_name, int64_t first, int64_t last) {
    const int64_t path = specwise_gguf::parse_path(path_name);
    const int64_t n = hidden.size(0), H = model_.hidden, d = model_.head_dim;
    const int64_t L = num_layers();
    if (last < 0) last = L;
    TORCH_CHECK(0 <= first && first <= last && last <= L, "layers [", first, ", ", last, ") are not within [0, ", L,
                ")");
    TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == H && hidden.scalar_type() == torch::kFloat &&
                    hidden.is_contiguous(), "hidden must be contiguous float32 [n, ", H, "]");
    // One rotary table [n, head_dim], or several [tables, n, head_dim] that layers pick from (Layer::rope).
    TORCH_CHECK(cos.sizes() == sin.sizes() && (cos.dim() == 2 || cos.dim() == 3) && cos.size(-2) == n &&
                    cos.size(-1) == d, "cos and sin must be [n, head_dim] or [tables, n, head_dim]");
    const int64_t tables = cos.dim() == 3 ? cos.size(0) : 1;
    for (const Layer& layer : model_.layers)
      TORCH_CHECK(layer.rope < tables, "a layer reads rotary table ", layer.rope, " of ", tables);
    if (n == 0) return;
    const auto cs = cos.to(torch::kFloat).contiguous(), sn = sin.to(torch::kFloat).contiguous();
    for (int64_t i = 0; i < n; ++i) TORCH_CHECK(!seen[i].empty(), "row ", i, " attends to nothing");
    std::vector<int64_t> capture_at(L, -1);
    for (size_t c = 0; c < capture.size(); ++c) {
      TORCH_CHECK(capture[c] >= first && capture[c] < last, "capture layer ", capture[c], " is not run");
      capture_at[capture[c]] = static_cast<int64_t>(c);
    }
    float* cap = nullptr;
    if (!capture.empty()) {
      TORCH_CHECK(captured.has_value() && captured->is_contiguous() && captured->scalar_type() == torch::kFloat &&
                      captured->numel() == n * static_cast<int64_t>(capture.size()) * H,
                  "captured must be contiguous float32 [n, len(capture), hidden]");
      cap = captured->data_ptr<float>();
    }
    const specwise_pass::Rows rows{n, hidden.data_ptr<float>(), where_to, seen, cs.data_ptr<float>(),
                                   sn.data_ptr<float>(), cap, static_cast<int64_t>(capture.size()), capture_at};
    specwise_pass::run_layers(model_, rows, first, last, path);
  }

  specwise_pass::Model model_;
};

}  // namespace

namespace specwise_pass {

const Kernels& pass_kernels(int64_t path, bool vec) {
  if (!vec || path == kScalar) return scalar::kernels;
  if (path >= kAvx512 && avx512::usable()) return avx512::kernels;  // kAvx512 and kAmx
  return avx2::kernels;
}

}  // namespace specwise_pass

namespace specwise_gguf {

// The pass's attention alone, for the tests: queries [nq, d] over the entries rows[i] (ascending slots) of
// keys and values [slots, d], as one call of the AVX-512 table's attend (wide) or the AVX2 one's.
torch::Tensor attend(torch::Tensor queries, torch::Tensor keys, torch::Tensor values,
                     const std::vector<std::vector<int32_t>>& rows, double scale, double softcap, bool wide) {
  TORCH_CHECK(queries.dim() == 2 && keys.dim() == 2 && keys.sizes() == values.sizes() &&
                  queries.size(1) == keys.size(1), "queries [nq, d], keys and values [slots, d]");
  const int64_t nq = queries.size(0), d = queries.size(1);
  TORCH_CHECK(nq <= kBatch && static_cast<int64_t>(rows.size()) == nq && d % 8 == 0, "at most ", kBatch,
              " queries, one entry list each, d a multiple of 8");
  TORCH_CHECK(!wide || specwise_pass::avx512::usable(), "this CPU has no AVX-512");
  auto q = queries.to(torch::kFloat).contiguous(), k = keys.to(torch::kFloat).contiguous();
  auto v = values.to(torch::kFloat).contiguous();
  auto out = torch::zeros({nq, d}, torch::kFloat);
  size_t widest = 0;
  for (const auto& r : rows) {
    TORCH_CHECK(!r.empty(), "each query sees at least one entry");
    for (int32_t slot : r) TORCH_CHECK(slot >= 0 && slot < keys.size(0), "slot ", slot, " is outside the keys");
    widest = std::max(widest, r.size());
  }
  std::vector<float> scores(nq * (widest + 8)), sums(nq * d);
  Query batch[kBatch];
  for (int64_t b = 0; b < nq; ++b)
    batch[b] = {q.data_ptr<float>() + b * d, rows[b].data(), static_cast<int64_t>(rows[b].size()),
                scores.data() + b * (widest + 8), sums.data() + b * d, out.data_ptr<float>() + b * d, 0.f, 0.f};
  const auto& kernels = wide ? specwise_pass::avx512::kernels : specwise_pass::avx2::kernels;
  kernels.attend(batch, static_cast<int>(nq), k.data_ptr<float>(), v.data_ptr<float>(), d, static_cast<float>(scale),
                 static_cast<float>(softcap));
  return out;
}

// The pass's gated activation alone, for the tests: silu(gate) * up (activation 0) or gelu_tanh(gate) * up
// (1), by the AVX-512 table (wide) or the AVX2 one.
torch::Tensor activate(torch::Tensor gate, torch::Tensor up, int64_t activation, bool wide) {
  TORCH_CHECK(gate.dim() == 1 && gate.sizes() == up.sizes() && gate.size(0) % 8 == 0,
              "gate and up: one row each, the same length, a multiple of 8");
  TORCH_CHECK(!wide || specwise_pass::avx512::usable(), "this CPU has no AVX-512");
  auto g = gate.to(torch::kFloat).contiguous(), u = up.to(torch::kFloat).contiguous();
  auto out = torch::empty_like(g);
  const auto& kernels = wide ? specwise_pass::avx512::kernels : specwise_pass::avx2::kernels;
  (activation == specwise_pass::kGeluTanh ? kernels.gelu_tanh_mul : kernels.silu_mul)(
      g.data_ptr<float>(), u.data_ptr<float>(), g.size(0), out.data_ptr<float>());
  return out;
}

void bind_pass(pybind11::module& m) {
  m.def("activate", &activate, "the decoder pass's gated activation of one row (for the tests)",
        pybind11::arg("gate"), pybind11::arg("up"), pybind11::arg("activation") = 0, pybind11::arg("wide") = false);
  m.def("attend", &attend, "the decoder pass's attention of up to 16 queries (for the tests)",
        pybind11::arg("queries"), pybind11::arg("keys"), pybind11::arg("values"), pybind11::arg("rows"),
        pybind11::arg("scale"), pybind11::arg("softcap") = 0.0, pybind11::arg("wide") = false);
  pybind11::class_<Pass>(m, "DecoderPass", "every decoder layer of a GGUF decoder model as one call")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, int64_t, double, double>(),
           pybind11::arg("hidden"), pybind11::arg("heads"), pybind11::arg("kv_heads"), pybind11::arg("head_dim"),
           pybind11::arg("intermediate"), pybind11::arg("eps"), pybind11::arg("activation") = 0,
           pybind11::arg("attention_scale") = 0.0, pybind11::arg("softcap") = 0.0)
      .def("add_layer", &Pass::add_layer, pybind11::arg("input_norm"), pybind11::arg("qkv"), pybind11::arg("o"),
           pybind11::arg("post_norm"), pybind11::arg("gate_up"), pybind11::arg("down"),
           pybind11::arg("q_norm") = pybind11::none(), pybind11::arg("k_norm") = pybind11::none(),
           pybind11::arg("attn_out_norm") = pybind11::none(), pybind11::arg("mlp_out_norm") = pybind11::none(),
           pybind11::arg("window") = 0, pybind11::arg("rope") = 0)
      .def("num_layers", &Pass::num_layers)
      .def("run", &Pass::run, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("run_ragged", &Pass::run_ragged, pybind11::call_guard<pybind11::gil_scoped_release>());
}

}  // namespace specwise_gguf
