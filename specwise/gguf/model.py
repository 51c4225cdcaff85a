"""A decoder model (specwise.runners.architectures) whose weights stay in the GGUF file's stored blocks.

The model (`GGUFCausalLM`) is the module tree of the Hugging Face architecture of the
model's config (read from the file's metadata, specwise.gguf.config), under the same
names but without transformers' modeling code; the architecture's ArchitectureSpec says which
GGUF tensor fills which module (Phi-3's fused qkv and gate/up tensors stay one module each,
as in transformers; Llama's interleaved q/k rows are put back in order; a file's rope_freqs
divide the rotary frequencies). Every quantized linear layer is a
`GGUFLinear` (the stored blocks, multiplied by specwise's kernel,
specwise/kernels/gguf_linear.cpp) and the token embedding a `GGUFEmbedding` (rows
dequantized on lookup). Norms and biases are float32, and so are the activations.
No dense copy of a quantized weight is made: the blocks are read from the file once, so
resident memory stays close to the file's size. This *is* the target for the `gguf`
format: dequantizing to bfloat16 would be slower and not even exact (bfloat16 cannot
hold every dequantized value).

Both runners take it: the lean runner calls the modules, and the Hugging Face runner
calls transformers' model built over the same modules (`hf_model()`). The kernel keeps
a row's result independent of the other rows of a pass (docs/DESIGN.md, "Numerics"), so
speculative output equals this model's own plain decoding token for token.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from specwise.kernels.gguf import SUPPORTED_TYPES, GGUFWeight, huge_page_buffer, interleave, interleaves
from specwise.runners.architectures import ARCHITECTURES as _SPECS
from specwise.runners.architectures import ArchitectureSpec, decoder_plan
from specwise.gguf.file import (DAMAGED, GGUFDamagedError, GGUFFormatError, GGUFHeader, read_header, shown,
                                       tensor_bytes, type_name)
from specwise.runners.gguf_layers import GGUFEmbedding, GGUFLinear
from specwise.runners.layers import activate

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ARCHITECTURES = tuple(_SPECS)  # transformers' model_types of the architectures the gguf format runs
# The float types the loader reads as float32, by ggml type id -> how NumPy reads them (names and sizes:
# specwise.gguf.file.GGML_TYPES); the block types run through the kernel (SUPPORTED_TYPES).
FLOAT_TYPES = {0: np.float32, 1: np.float16, 30: np.uint16}

# GGUF tensor name -> the Hugging Face module (or parameter) it fills.
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Llama 3.1+ files: per-dimension divisors of the rotary frequencies (llama3 rope scaling, precomputed).
_ROPE_FREQS = "rope_freqs.weight"
# Phi-3 long-context files: rotary factors switched by the sequence's length, which the layer pass does not keep.
LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _llama_rows(out_features: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's permutation of Llama q/k weights (interleaved to halves)."""
    dim = out_features // heads // 2
    return torch.arange(out_features).view(heads, dim, 2).transpose(1, 2).reshape(-1)


# Layers that read the same input and that the lean runner multiplies as one (runners/fusion.py).
_SIDE_BY_SIDE = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))


def _read_blocks(path: Path, tensors: dict) -> dict[str, GGUFWeight]:
    """Every quantized tensor's blocks, read from the file into memory of their own (one buffer).

    Read, not mapped: touched pages of a memory map stay mapped, so a copy out of the map
    would hold the bytes twice. Layers that share an input and a block type are read into
    one buffer, side by side, so the runner multiplies them as one without copying; every
    block is resident once, and the file's size bounds the weights' memory.
    """
    groups: list[list[str]] = []
    grouped: set[str] = set()
    for name in tensors:
        match = _LAYER_NAME.match(name)
        for members in _SIDE_BY_SIDE if match and match.group(3) == "weight" else ():
            if match.group(2) == members[0]:
                names = [f"blk.{match.group(1)}.{m}.weight" for m in members]
                run: list[str] = []
                for member in (n for n in names if n in tensors):  # consecutive members of one type
                    if run and tensors[member].tensor_type != tensors[run[-1]].tensor_type:
                        groups.append(run)
                        run = []
                    run.append(member)
                groups.append(run)
                grouped.update(names)
    groups += [[name] for name in tensors if name not in grouped]
    # Dense tensors are read by _dense; a tensor under two names (tied embeddings) is read once, under the first.
    first_name: dict[int, str] = {}
    read: list[list[str]] = []
    for group in groups:
        if any(tensors[name].tensor_type not in SUPPORTED_TYPES for name in group):
            continue
        if len(group) > 1 or id(tensors[group[0]]) not in first_name:
            first_name.update((id(tensors[name]), name) for name in group)
            read.append(group)
    # All of them in one buffer, each group at a multiple of 64 bytes, that asks for huge pages: a pass streams
    # every byte of it, and 4 KiB pages cost a third more time (kernels/gguf.py, huge_page_buffer).
    padded = [(sum(tensors[name].n_bytes for name in group) + 63) // 64 * 64 for group in read]
    arena = huge_page_buffer(sum(padded))
    weights: dict[str, GGUFWeight] = {}
    start = 0
    with open(path, "rb") as handle:
        for group, size_of_group in zip(read, padded):
            offset = start
            for name in group:
                tensor = tensors[name]
                size = tensor.n_bytes
                handle.seek(tensor.data_offset)
                if handle.readinto(memoryview(arena[offset:offset + size].numpy())) != size:
                    raise GGUFFormatError(f"{path.name}: tensor {name} is cut short")
                in_features, out_features = tensor.shape  # ggml: fastest dimension first
                data = arena[offset:offset + size].view(out_features, -1)
                weights[name] = GGUFWeight(data, tensor.tensor_type, (out_features, in_features))
                offset += size
            start += size_of_group
    for name in tensors:  # the other names of tensors read once
        if name not in weights and id(tensors[name]) in first_name:
            weights[name] = weights[first_name[id(tensors[name])]]
    return weights


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    tensor_type: int
    shape: tuple[int, ...]  # ggml's order: the fastest dimension first
    n_bytes: int
    data_offset: int


def _tensor_table(path: Path, header: GGUFHeader | None = None) -> tuple[dict[str, _TensorInfo],
                                                                        dict[str, torch.Tensor]]:
    """Where each tensor lies in the file, and the dense (F32/F16/BF16) ones as float32.

    Only the header is read (gguf/file.py): the metadata's values, a tokenizer's
    vocabulary among them, are walked past, not built.
    """
    header = header or read_header(path)
    size = path.stat().st_size
    tensors: dict[str, _TensorInfo] = {}
    dense: dict[str, torch.Tensor] = {}
    for entry in header.tensors:
        ggml_type = entry.ggml_type
        if ggml_type not in SUPPORTED_TYPES and ggml_type not in FLOAT_TYPES:
            raise GGUFFormatError(f"{path.name}: tensor {entry.name} is stored as {type_name(ggml_type)}, "
                                  f"which the gguf format does not run (supported: "
                                  f"{', '.join(n for n, _, _ in SUPPORTED_TYPES.values())}, F32, F16, BF16); "
                                  "run this file in the dense format (--target-format dense)")
        n_bytes = tensor_bytes(ggml_type, entry.shape)
        if entry.data_offset + n_bytes > size:
            raise GGUFFormatError(f"{path.name}: tensor {entry.name} is cut short (the file ends at byte {size}); "
                                  "the file is incomplete (prepare it again)")
        info = _TensorInfo(entry.name, ggml_type, entry.shape, n_bytes, entry.data_offset)
        tensors[entry.name] = info
        if ggml_type in FLOAT_TYPES:
            dense[entry.name] = _dense(path, info)
    if "output.weight" not in tensors:  # tied embeddings: the output layer reads the embedding's blocks
        if "token_embd.weight" not in tensors:
            raise GGUFFormatError(f"{path.name} holds no token embedding (token_embd.weight); {DAMAGED}")
        tensors["output.weight"] = tensors["token_embd.weight"]
        if "token_embd.weight" in dense:
            dense["output.weight"] = dense["token_embd.weight"]
    return tensors, dense


def _dense(path: Path, tensor: _TensorInfo) -> torch.Tensor:
    """An F32/F16/BF16 tensor as float32, in PyTorch's [out, in] order."""
    stored = FLOAT_TYPES[tensor.tensor_type]
    data = np.fromfile(path, dtype=stored, count=tensor.n_bytes // np.dtype(stored).itemsize,
                       offset=tensor.data_offset)
    if tensor.tensor_type == 30:  # bfloat16: the upper half of a float32
        data = (data.astype(np.uint32) << 16).view(np.float32)
    shape = [int(d) for d in reversed(tensor.shape)]
    return torch.from_numpy(np.array(data, dtype=np.float32).reshape(shape))


class _Pending(nn.Module):
    """Where a matrix of the file goes before it is read: the shape the config gives it. (Not a meta
    tensor: PyTorch's meta device imports its shape-reasoning machinery, 70 MB of it.)"""

    def __init__(self, out_features: int, in_features: int, bias: bool = False, embedding: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features, self.embedding = out_features, in_features, embedding
        self.expects_bias = bias
        self.register_parameter("bias", None)  # a file may list the bias first: it waits here for its weight


class _Norm(nn.Module):
    """An RMSNorm's weight (the runners apply the norm themselves)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.size, self.variance_epsilon = size, eps
        self.register_parameter("weight", None)  # read from the file


def _linear(in_features: int, out_features: int, bias: bool) -> _Pending:
    return _Pending(out_features, in_features, bias)


class _MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool, spec: ArchitectureSpec) -> None:
        super().__init__()
        self.activation = spec.activation
        if spec.fused_gate_up:  # one stored matrix: [gate | up] rows
            self.gate_up_proj = _linear(hidden, 2 * intermediate, bias)
        else:
            self.gate_proj = _linear(hidden, intermediate, bias)
            self.up_proj = _linear(hidden, intermediate, bias)
        self.down_proj = _linear(intermediate, hidden, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # as transformers' gated MLPs
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(activate(gate, self.activation) * up)


class _Layer(nn.Module):
    def __init__(self, config, spec: ArchitectureSpec) -> None:
        super().__init__()
        hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        qkv_bias = spec.qkv_bias or bool(getattr(config, "attention_bias", False))
        o_bias = bool(getattr(config, "attention_bias", False)) and config.model_type == "llama"
        mlp_bias = bool(getattr(config, "mlp_bias", False))
        self.self_attn = nn.Module()
        if spec.fused_qkv:  # one stored matrix: [q | k | v] rows
            self.self_attn.qkv_proj = _linear(hidden, (heads + 2 * kv_heads) * head_dim, qkv_bias)
        else:
            self.self_attn.q_proj = _linear(hidden, heads * head_dim, qkv_bias)
            self.self_attn.k_proj = _linear(hidden, kv_heads * head_dim, qkv_bias)
            self.self_attn.v_proj = _linear(hidden, kv_heads * head_dim, qkv_bias)
        self.self_attn.o_proj = _linear(heads * head_dim, hidden, o_bias)
        if spec.qk_norm:
            self.self_attn.q_norm = _Norm(head_dim, config.rms_norm_eps)
            self.self_attn.k_norm = _Norm(head_dim, config.rms_norm_eps)
        self.mlp = _MLP(hidden, config.intermediate_size, mlp_bias, spec)
        for target in spec.tensors.values():
            if "." not in target:  # a layer norm over the hidden size
                setattr(self, target, _Norm(hidden, config.rms_norm_eps))


def _dynamic_rope_update(forward):
    from transformers.modeling_rope_utils import dynamic_rope_update

    return dynamic_rope_update(forward)


class RotaryEmbedding(nn.Module):
    """cos and sin of the rotary positions with the float operations of transformers' rotary modules,
    so the lean runner's rows are bit-identical to what it computed from those modules.

    A config whose rope_parameters hold one entry per layer type (Gemma 3: a local base for the
    sliding layers) gets one table per type, as transformers' Gemma 3 module keeps them
    (`<type>_inv_freq`); `forward(x, positions, layer_type)` picks one."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.max_seq_len_cached = self.original_max_seq_len = config.max_position_embeddings
        self.layer_types = [t for t in decoder_plan(config).rope_types if t is not None]
        self.rope_type: str | dict[str, str]
        if not self.layer_types:
            self.rope_type = config.rope_parameters["rope_type"]
            inv_freq, self.attention_scaling = _inverse_frequencies(config, config.rope_parameters, None)
            self.inv_freq = nn.Buffer(inv_freq, persistent=False)
            self.original_inv_freq = nn.Buffer(inv_freq.clone(), persistent=False)
            return
        self.rope_type = {}
        for kind in self.layer_types:
            self.rope_type[kind] = config.rope_parameters[kind]["rope_type"]
            inv_freq, scaling = _inverse_frequencies(config, config.rope_parameters[kind], kind)
            setattr(self, f"{kind}_inv_freq", nn.Buffer(inv_freq, persistent=False))
            setattr(self, f"{kind}_original_inv_freq", nn.Buffer(inv_freq.clone(), persistent=False))
            setattr(self, f"{kind}_attention_scaling", scaling)

    def divide_frequencies(self, factors: torch.Tensor) -> None:
        """A file's rope_freqs: each rotary frequency divided by its factor (llama.cpp's llama3 scaling)."""
        if self.layer_types:
            raise GGUFFormatError(f"{_ROPE_FREQS} in a model with a rotary table per layer type "
                                  f"({', '.join(self.layer_types)}) is not one specwise reads; use the dense format")
        for name in ("inv_freq", "original_inv_freq"):
            buffer = getattr(self, name)
            if factors.shape != buffer.shape:
                raise GGUFFormatError(f"{_ROPE_FREQS} holds {list(factors.shape)} factors, the rotary embedding "
                                      f"{list(buffer.shape)} frequencies")
            setattr(self, name, nn.Buffer(buffer / factors.float(), persistent=False))

    @_dynamic_rope_update  # the rope types whose frequencies follow the sequence length
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        prefix = "" if layer_type is None else f"{layer_type}_"
        inv_freq = getattr(self, f"{prefix}inv_freq")
        scaling = getattr(self, f"{prefix}attention_scaling")
        freqs = position_ids[..., None].float() * inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)


def _inverse_frequencies(config, parameters: dict, layer_type: str | None) -> tuple[torch.Tensor, float]:
    """A rotary table's inverse frequencies [head_dim / 2] and cos/sin scaling, as transformers computes them."""
    if parameters["rope_type"] == "default":
        base = parameters["rope_theta"]
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    init = ROPE_INIT_FUNCTIONS[parameters["rope_type"]]
    return init(config) if layer_type is None else init(config, layer_type=layer_type)


class GGUFCausalLM(nn.Module):
    """A decoder causal LM's modules under Hugging Face's names (model.layers[i].self_attn.q_proj,
    ...), holding the GGUF blocks, without transformers' modeling code.

    The lean runner reads these modules and runs the layers itself, so running the gguf target
    needs neither that code's import (about 120 MB of resident memory and 3 s of start-up,
    docs/BENCHMARKS.md "Memory") nor its model object. `forward` and `hf_model()` give the
    Hugging Face model of the same modules (built on first use, sharing every block) for the
    Hugging Face runner and for reference logits.
    """

    norm_offset_stored = True  # the converter wrote Gemma's +1 into the norm weights (runners.fusion)

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.generation_config = None
        self.model = nn.Module()
        self.model.embed_tokens = _Pending(config.vocab_size, config.hidden_size, embedding=True)
        spec = _SPECS[config.model_type]
        self.model.layers = nn.ModuleList(_Layer(config, spec) for _ in range(config.num_hidden_layers))
        self.model.norm = _Norm(config.hidden_size, config.rms_norm_eps)
        self.model.rotary_emb = RotaryEmbedding(config)
        self.lm_head = _linear(config.hidden_size, config.vocab_size, False)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def forward(self, *args, **kwargs):
        return self.hf_model()(*args, **kwargs)

    @property
    def built_hf_model(self):
        """transformers' model if `hf_model()` has built it, else None."""
        return self.__dict__.get("_hf")  # not a submodule: the modules are registered once, here

    def hf_model(self):
        """transformers' model of these modules (the same blocks and norms, not a copy)."""
        hf = self.built_hf_model
        if hf is None:
            from accelerate import init_empty_weights
            from transformers import AutoModelForCausalLM

            plan = decoder_plan(self.config)
            # Soft-capped attention needs transformers' eager attention (its fused kernels cap nothing).
            eager = {"attn_implementation": "eager"} if plan.attention_softcap else {}
            with init_empty_weights(include_buffers=False):
                hf = AutoModelForCausalLM.from_config(self.config, dtype=torch.float32, **eager)
            hf.generation_config = self.generation_config
            offset = plan.spec.norm_offset
            for name, module in self.named_modules():
                if isinstance(module, (GGUFLinear, GGUFEmbedding, nn.Linear, nn.Embedding)):
                    parent, attribute = _parent(hf, name)
                    scale = getattr(getattr(parent, attribute), "embed_scale", None)
                    setattr(parent, attribute, module if scale is None else _Scaled(module, scale))
                elif isinstance(module, _Norm):  # transformers' Gemma norms add the offset llama.cpp stored
                    weight = module.weight if not offset else nn.Parameter(module.weight - offset,
                                                                           requires_grad=False)
                    hf.get_submodule(name).weight = weight
            for name, buffer in self.model.rotary_emb.named_buffers():  # a file's rope_freqs included
                setattr(hf.model.rotary_emb, name, buffer)
            hf.model.rotary_emb.to(self.device)
            self.__dict__["_hf"] = hf.eval()
        return hf


class _Scaled(nn.Module):
    """An embedding whose rows transformers' module scales itself (Gemma's): the same scaling on ours."""

    def __init__(self, embedding: nn.Module, scale: torch.Tensor) -> None:
        super().__init__()
        self.embedding, self.embed_scale = embedding, scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.embedding(ids)
        return rows * self.embed_scale.to(rows.dtype)


def load_gguf_model(gguf_path: str | Path, config: str | Path | PretrainedConfig | None = None) -> GGUFCausalLM:
    """The model of a GGUF file with its weights as stored.

    config: the model's transformers config, or a directory holding it (config.json); by default
    the file's own metadata (specwise.gguf.config).
    """
    from transformers import AutoConfig, GenerationConfig

    from specwise.gguf.config import gguf_config, gguf_generation_config

    gguf_path = Path(gguf_path)
    config_dir = config if isinstance(config, (str, Path)) else None
    if config_dir is not None:
        config = AutoConfig.from_pretrained(config_dir)
    elif config is None:
        config = gguf_config(gguf_path)
    else:
        config = copy.deepcopy(config)  # the float32 dtype below is this model's, not the caller's
    if config.model_type not in ARCHITECTURES:
        raise GGUFFormatError(f"the gguf format runs {', '.join(ARCHITECTURES)} models, not "
                              f"{config.model_type!r}; use the dense format")
    config.dtype = torch.float32
    model = GGUFCausalLM(config)  # every matrix pending: filled from the file below
    model.generation_config = gguf_generation_config(config)
    if config_dir is not None:
        try:
            model.generation_config = GenerationConfig.from_pretrained(config_dir)
        except OSError:
            pass  # a directory without generation_config.json: the config's special tokens
    spec = _SPECS[config.model_type]
    header = read_header(gguf_path)  # the tensor table checked against the file (gguf_file.check_tensors)
    _check_shapes(model, header, spec, gguf_path)  # and against the config, before any tensor is read
    tensors, dense = _tensor_table(gguf_path, header)
    longrope = [name for name in LONGROPE_TENSORS if name in tensors]
    if longrope:
        raise GGUFFormatError(f"{gguf_path.name} holds {longrope[0]} (long-context rotary factors chosen by the "
                              "sequence's length), which the gguf format does not run; use the dense format")
    if _ROPE_FREQS in dense:
        model.model.rotary_emb.divide_frequencies(dense.pop(_ROPE_FREQS))
        del tensors[_ROPE_FREQS]
    blocks = _read_blocks(gguf_path, tensors)
    # Blocks in 16-row groups where the kernel's tiles read them so (kernels/gguf.py, interleaves), once each
    # (a tied tensor is one weight under two names), after any permutation of their rows.
    laid_out: dict[int, GGUFWeight] = {}

    def layout(weight: GGUFWeight) -> GGUFWeight:
        if id(weight) not in laid_out:
            laid_out[id(weight)] = interleave(weight) if interleaves(weight.ggml_type, weight.out_features) else weight
        return laid_out[id(weight)]

    for name, tensor in tensors.items():
        target, kind = _hf_name(name, spec)
        rows = None
        if spec.permute_qk and kind == "weight" and target.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if target.endswith("q_proj") else config.num_key_value_heads
            rows = _llama_rows(tensor.shape[1], heads)
        if name in dense:
            value = dense[name]
            _set_parameter(model, target, kind, value if rows is None else value[rows])
        else:
            weight = blocks[name]
            if rows is not None:  # whole rows of blocks move, in place: the permutation is exact
                weight.data.copy_(weight.data[rows])
            _set_module(model, target, layout(weight))
    _check_biases(model)
    missing = [n for n, m in model.named_modules() if isinstance(m, _Pending) or (isinstance(m, _Norm) and m.weight is None)]
    if missing:
        where = f" in {config_dir}" if config_dir is not None else ""
        raise GGUFFormatError(f"{gguf_path.name} does not hold every weight of the {config.model_type} model"
                              f"{where}: missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; "
                              f"{DAMAGED}")
    return model.eval()


def _check_shapes(model: GGUFCausalLM, header: GGUFHeader, spec: ArchitectureSpec, path: Path) -> None:
    """Every tensor of the file has a place in the model and the shape the config gives that place
    (header only: no tensor's data is read before this holds, so the file's size bounds the reads)."""
    for entry in header.tensors:
        if entry.name == _ROPE_FREQS or entry.name in LONGROPE_TENSORS:
            continue
        try:
            target, kind = _hf_name(entry.name, spec)
        except GGUFFormatError as error:
            raise GGUFFormatError(f"{path.name}: {error}") from None
        parent_name, _, attribute = target.rpartition(".")
        try:
            module = getattr(model.get_submodule(parent_name), attribute)
        except AttributeError:
            raise GGUFDamagedError(f"{path.name}: tensor {shown(entry.name)} has no place in this "
                                   f"{spec.model_type} model; {DAMAGED}") from None
        if kind == "bias" and getattr(module, "expects_bias", False):
            expected: tuple[int, ...] = (module.out_features,)
        elif kind == "weight" and isinstance(module, _Norm):
            expected = (module.size,)
        elif kind == "weight" and isinstance(module, _Pending):
            expected = (module.in_features, module.out_features)  # ggml's order
        else:
            raise GGUFFormatError(f"{path.name}: tensor {shown(entry.name)} ({target}.{kind}) is not one the "
                                  f"{spec.model_type} model of this config holds")
        stored = tuple(entry.shape)
        if stored != expected and not (len(expected) == 1 and math.prod(stored) == expected[0]
                                       and entry.ggml_type in FLOAT_TYPES):
            raise GGUFDamagedError(f"{path.name}: tensor {shown(entry.name)} is {list(stored)}, the config gives "
                                   f"{target}.{kind} {list(expected)}; {DAMAGED}")


def _hf_name(name: str, spec: ArchitectureSpec = _SPECS["qwen2"]) -> tuple[str, str]:
    """('model.layers.3.self_attn.q_proj', 'weight') for 'blk.3.attn_q.weight' (in `spec`'s architecture)."""
    stem, _, kind = name.rpartition(".")
    if stem in _GLOBAL:
        return _GLOBAL[stem], kind
    match = _LAYER_NAME.match(name)
    if match and match.group(2) in spec.tensors:
        return f"model.layers.{match.group(1)}.{spec.tensors[match.group(2)]}", match.group(3)
    raise GGUFFormatError(f"GGUF tensor {name!r} has no place in a {spec.model_type} model")


def _parent(model: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    parent_name, _, attribute = dotted.rpartition(".")
    return model.get_submodule(parent_name), attribute


def _set_module(model: nn.Module, target: str, weight: GGUFWeight) -> None:
    parent, attribute = _parent(model, target)
    old = _pending(parent, attribute, target)
    if (old.out_features, old.in_features) != weight.shape:
        raise GGUFFormatError(f"{target}: the file's {'embedding' if old.embedding else 'weight'} is "
                              f"{list(weight.shape)}, the config's {[old.out_features, old.in_features]}")
    if old.embedding:
        setattr(parent, attribute, GGUFEmbedding(weight))
        return
    module = GGUFLinear(weight, None if old.bias is None else old.bias.data)
    # The file may list a layer's bias after its weight: _set_parameter fills it, _check_biases checks.
    module.expects_bias = old.expects_bias
    setattr(parent, attribute, module)


def _pending(parent: nn.Module, attribute: str, target: str) -> _Pending:
    old = getattr(parent, attribute)
    if not isinstance(old, _Pending):
        raise GGUFFormatError(f"{target}: the file holds this weight twice")
    return old


def _set_parameter(model: nn.Module, target: str, kind: str, value: torch.Tensor) -> None:
    """A dense tensor of the file: a norm's weight, a bias, or a matrix stored unquantized (F32/F16/BF16)."""
    parent, attribute = _parent(model, target)
    module = getattr(parent, attribute)
    if kind == "bias" and getattr(module, "expects_bias", False):
        expected = [module.out_features]
    elif kind == "weight" and isinstance(module, _Norm):
        expected = [module.size]
    elif kind == "weight" and isinstance(module, _Pending):
        expected = [module.out_features, module.in_features]
    else:
        raise GGUFFormatError(f"{target}.{kind}: the file holds {list(value.shape)}, the config expects none")
    if list(value.shape) != expected and not (kind == "bias" and value.numel() == expected[0]):
        raise GGUFFormatError(f"{target}.{kind}: the file holds {list(value.shape)}, the config expects {expected}")
    parameter = nn.Parameter(value.reshape(expected), requires_grad=False)
    if kind == "bias" or isinstance(module, _Norm):
        setattr(module, kind, parameter)
    elif module.embedding:
        setattr(parent, attribute, nn.Embedding.from_pretrained(parameter, freeze=True))
    else:
        with warnings.catch_warnings():  # a 0 x 0 layer whose weight is set right after: no initialization
            warnings.simplefilter("ignore")
            layer = nn.Linear(0, 0, bias=False)
        layer.weight, layer.bias, (layer.out_features, layer.in_features) = parameter, module.bias, expected
        layer.expects_bias = module.expects_bias
        setattr(parent, attribute, layer)


def _check_biases(model: nn.Module) -> None:
    for name, module in model.named_modules():
        if getattr(module, "expects_bias", False) and module.bias is None:
            raise GGUFFormatError(f"{name}: the config has a bias but the file holds none")
