"""A Llama/Qwen2 model whose weights stay in the GGUF file's stored blocks.

The model is the Hugging Face architecture built from the prepared config, with
every quantized linear layer replaced by `GGUFLinear` (the stored blocks,
multiplied by specwise's kernel, specwise/kernels/gguf_linear.cpp) and the token
embedding by `GGUFEmbedding` (rows dequantized on lookup). Norms and biases are
float32, and so are the activations. No dense copy of a quantized weight is made:
the blocks are read from the file's memory map, so resident memory stays close to
the file's size. This *is* the target for the `gguf` format: dequantizing to
bfloat16 would be slower and not even exact (bfloat16 cannot hold every
dequantized value).

Both runners take it: the lean runner calls the modules, and so does the Hugging
Face forward. The kernel keeps a row's result independent of the other rows of a
pass (docs/DESIGN.md, "Numerics"), so speculative output equals this model's own
plain decoding token for token.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specwise.kernels.gguf import SUPPORTED_TYPES, GGUFWeight, dequantize_rows, gguf_linear

log = logging.getLogger("specwise")

ARCHITECTURES = ("qwen2", "llama")
_DENSE_TYPES = {0: "F32", 1: "F16", 30: "BF16"}

# GGUF tensor name -> the Hugging Face module (or parameter) it fills.
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_PER_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


class GGUFFormatError(ValueError):
    """The GGUF file holds something this format cannot run (a block type, an architecture)."""


class GGUFLinear(nn.Module):
    """y = x @ W.T (+ bias) with W in its stored GGUF blocks (float32 activations in and out)."""

    def __init__(self, weight: GGUFWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.gguf_weight = weight
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.expects_bias = bias is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gguf_linear(x, self.gguf_weight, self.bias)

    @classmethod
    def concatenate(cls, layers: list[GGUFLinear]) -> GGUFLinear:
        """One layer whose outputs are the given layers' side by side (same block type and input;
        whole rows of blocks are copied, so the result is exact)."""
        first = layers[0].gguf_weight
        if any(m.gguf_weight.ggml_type != first.ggml_type or m.in_features != first.in_features for m in layers):
            raise ValueError("only GGUF layers of one block type and input size can be concatenated")
        data = torch.cat([m.gguf_weight.data for m in layers])
        weight = GGUFWeight(data, first.ggml_type, (data.shape[0], first.in_features))
        biases = [m.bias for m in layers]
        if all(b is None for b in biases):
            return cls(weight)
        return cls(weight, torch.cat([b.data if b is not None else torch.zeros(m.out_features)
                                      for b, m in zip(biases, layers)]))

    def select_rows(self, ids: torch.Tensor) -> GGUFLinear:
        """A copy holding only output rows `ids` (whole rows of blocks: exact)."""
        w = self.gguf_weight
        rows = GGUFWeight(w.data[ids].contiguous(), w.ggml_type, (len(ids), w.in_features))
        return GGUFLinear(rows, None if self.bias is None else self.bias.data[ids].clone())

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.gguf_weight.type_name}"


class GGUFEmbedding(nn.Module):
    """Token embedding rows dequantized from GGUF blocks on lookup."""

    def __init__(self, weight: GGUFWeight) -> None:
        super().__init__()
        self.gguf_weight = weight
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.gguf_weight, ids)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings} x {self.embedding_dim}, {self.gguf_weight.type_name}"


def gguf_architecture(path: Path) -> str:
    """general.architecture of a GGUF file."""
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("general.architecture")
    return "unknown" if field is None else str(field.contents())


def _llama_rows(out_features: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's permutation of Llama q/k weights (interleaved to halves)."""
    dim = out_features // heads // 2
    return torch.arange(out_features).view(heads, dim, 2).transpose(1, 2).reshape(-1)


def _dense(tensor) -> torch.Tensor:
    """An F32/F16/BF16 tensor as float32, in PyTorch's [out, in] order."""
    from gguf import GGMLQuantizationType, quants

    data = np.asarray(tensor.data)
    if int(tensor.tensor_type) == 30:
        data = quants.dequantize(data, GGMLQuantizationType.BF16)
    shape = [int(d) for d in reversed(tensor.shape)]
    return torch.from_numpy(np.array(data, dtype=np.float32).reshape(shape))


def load_gguf_model(gguf_path: str | Path, config_dir: str | Path) -> nn.Module:
    """The model of `config_dir` (a prepared directory: config.json) with the weights of `gguf_path` as stored."""
    from accelerate import init_empty_weights
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    gguf_path = Path(gguf_path)
    config = AutoConfig.from_pretrained(config_dir)
    if config.model_type not in ARCHITECTURES:
        raise GGUFFormatError(f"the gguf format runs {', '.join(ARCHITECTURES)} models, not "
                              f"{config.model_type!r}; use the dense format")
    config.dtype = torch.float32
    with init_empty_weights(include_buffers=False):  # parameters on "meta": filled from the file below
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    try:
        model.generation_config = GenerationConfig.from_pretrained(config_dir)
    except OSError:
        pass  # no generation_config.json: keep the one built from the config
    reader = GGUFReader(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    if "output.weight" not in tensors:  # tied embeddings: the output layer reads the embedding's blocks
        tensors["output.weight"] = tensors["token_embd.weight"]
    for name, tensor in tensors.items():
        target, kind = _hf_name(name)
        ggml_type = int(tensor.tensor_type)
        rows = None
        if config.model_type == "llama" and kind == "weight" and target.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if target.endswith("q_proj") else config.num_key_value_heads
            rows = _llama_rows(int(tensor.shape[1]), heads)
        if ggml_type in _DENSE_TYPES:
            value = _dense(tensor)
            if rows is not None:
                value = value[rows]
            _set_parameter(model, target, kind, value)
        elif ggml_type in SUPPORTED_TYPES:
            weight = GGUFWeight.from_reader_tensor(tensor, copy=rows is not None)
            if rows is not None:  # whole rows of blocks move: the permutation is exact
                weight = GGUFWeight(weight.data[rows].contiguous(), weight.ggml_type, weight.shape)
            _set_module(model, target, weight)
        else:
            raise GGUFFormatError(f"{gguf_path.name}: tensor {name} is stored as {tensor.tensor_type.name}, "
                                  f"which the gguf format does not run (supported: "
                                  f"{', '.join(n for n, _, _ in SUPPORTED_TYPES.values())}, F32, F16, BF16); "
                                  "use the dense format for this file")
    _check_biases(model)
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise GGUFFormatError(f"{gguf_path.name} does not hold every weight of the {config.model_type} model in "
                              f"{config_dir}: missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return model.eval()


def _hf_name(name: str) -> tuple[str, str]:
    """('model.layers.3.self_attn.q_proj', 'weight') for 'blk.3.attn_q.weight'."""
    stem, _, kind = name.rpartition(".")
    if stem in _GLOBAL:
        return _GLOBAL[stem], kind
    match = _LAYER_NAME.match(name)
    if match and match.group(2) in _PER_LAYER:
        return f"model.layers.{match.group(1)}.{_PER_LAYER[match.group(2)]}", match.group(3)
    raise GGUFFormatError(f"GGUF tensor {name!r} has no place in a Llama/Qwen2 model")


def _parent(model: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    parent_name, _, attribute = dotted.rpartition(".")
    return model.get_submodule(parent_name), attribute


def _set_module(model: nn.Module, target: str, weight: GGUFWeight) -> None:
    parent, attribute = _parent(model, target)
    old = getattr(parent, attribute)
    if isinstance(old, nn.Embedding):
        if (old.num_embeddings, old.embedding_dim) != weight.shape:
            raise GGUFFormatError(f"{target}: the file's embedding is {list(weight.shape)}, the config's "
                                  f"{[old.num_embeddings, old.embedding_dim]}")
        setattr(parent, attribute, GGUFEmbedding(weight))
        return
    if (old.out_features, old.in_features) != weight.shape:
        raise GGUFFormatError(f"{target}: the file's weight is {list(weight.shape)}, the config's "
                              f"{[old.out_features, old.in_features]}")
    bias = old.bias if isinstance(old, nn.Linear) else None
    module = GGUFLinear(weight, None if bias is None or bias.is_meta else bias.data)
    # The file may list a layer's bias after its weight: _set_parameter fills it, _check_biases checks.
    module.expects_bias = bias is not None
    setattr(parent, attribute, module)


def _set_parameter(model: nn.Module, target: str, kind: str, value: torch.Tensor) -> None:
    module = model.get_submodule(target)
    if isinstance(module, GGUFLinear):  # a bias of a quantized layer
        module.bias = nn.Parameter(value.reshape(-1), requires_grad=False)
        return
    old = getattr(module, kind)
    if old is None or tuple(old.shape) != tuple(value.shape):
        shape = None if old is None else list(old.shape)
        raise GGUFFormatError(f"{target}.{kind}: the file holds {list(value.shape)}, the config expects {shape}")
    if isinstance(module, nn.Embedding):
        module.weight = nn.Parameter(value, requires_grad=False)
    else:
        setattr(module, kind, nn.Parameter(value, requires_grad=False))


def _check_biases(model: nn.Module) -> None:
    for name, module in model.named_modules():
        if isinstance(module, GGUFLinear) and module.expects_bias and module.bias is None:
            raise GGUFFormatError(f"{name}: the config has a bias but the file holds none")
