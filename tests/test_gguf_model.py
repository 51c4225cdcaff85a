"""The gguf format: a model run from its GGUF blocks as stored.

- loading: the same function as a dense float32 model holding the dequantized weights (an
  independent path: `gguf.quants.dequantize` into plain nn.Linear layers), within the error of
  the kernel's int8 activations; a Llama file's permuted q/k rows come back in Hugging Face's
  order (checked against transformers' own GGUF loader);
- the native pass (every layer in one call) computes what the layer-by-layer PyTorch pass
  computes, on every kernel path;
- row independence of a whole pass: a block of n tokens scores each row bitwise as n one-token
  passes would (docs/DESIGN.md, "Numerics"), a prompt writes the same cache however it is
  chunked, and a batched PyTorch reading, which claims no row independence, is repeatable and
  close to that reading but not bitwise (the negative control); so
- greedy speculative decoding (n-gram, draft model, trees) equals this model's own plain
  decoding token for token, and (slow) sampled output has its distribution.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from helpers import ALPHA, PROMPT, SAMPLES, SAMPLING, exact_distribution, p_value, write_tiny_gguf
from specwise import SamplingParams, SpecConfig, SpecDecoder
from specwise.errors import ModelError
from specwise.gguf.model import GGUFFormatError, _hf_name, load_gguf_model
from specwise.runners.gguf_layers import GGUFLinear
from specwise.runners.lean import LeanRunner
from specwise.runners.passes import Attention, Implementation, Pass, PassKind, choose_pass
from specwise.testing import TINY_GGUF_TYPES, tiny_gguf_loaded, write_tiny_gguf_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0)


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("drafter"), seed=1)


def dequantized_reference(path, model_dir) -> torch.nn.Module:
    """The same model as a plain float32 Hugging Face model: every tensor through gguf's dequantizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32).eval()
    state = model.state_dict()
    for tensor in gguf.GGUFReader(path).tensors:
        target, kind = _hf_name(tensor.name)
        dense = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).astype(np.float32)
        state[f"{target}.{kind}"].copy_(torch.from_numpy(dense).reshape(state[f"{target}.{kind}"].shape))
    return model


def test_every_block_type_of_the_tiny_model_runs_from_its_blocks(target):
    layers = {name: m.gguf_weight.type_name for name, m in target.model.named_modules() if isinstance(m, GGUFLinear)}
    assert set(layers.values()) == set(TINY_GGUF_TYPES.values())  # Q4_K, Q6_K, Q5_0, Q8_0
    assert not [p for p in target.model.parameters() if p.dim() > 1]  # no dense copy of any matrix


def test_logits_equal_the_dequantized_model_within_activation_rounding(tmp_path):
    path, model_dir = write_tiny_gguf_model(tmp_path, seed=3)
    model, reference = load_gguf_model(path, model_dir), dequantized_reference(path, model_dir)
    ids = torch.tensor([[5, 9, 14, 5, 9, 30, 31, 2, 7]])
    with torch.inference_mode():
        got, want = model(ids).logits[0], reference(ids).logits[0]
    assert_close_to(got, want)
    # A wrong block layout would not be close: the same check fails against another file.
    other, other_dir = write_tiny_gguf_model(tmp_path / "other", seed=4)
    with torch.inference_mode():
        with pytest.raises(AssertionError):
            assert_close_to(got, dequantized_reference(other, other_dir)(ids).logits[0])


def assert_close_to(got: torch.Tensor, want: torch.Tensor) -> None:
    """Logits within the error of int8 activations: each matmul rounds its inputs to 2^-8 of their
    block's largest value; a random untrained model passes that on through its layers, so the mean
    difference stays near 2 % of the logits' spread (at most 4 %), single logits within 25 %, and
    the argmax holds."""
    spread = want.std()
    assert (got - want).abs().mean() < 0.04 * spread
    assert (got - want).abs().max() < 0.25 * spread
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_weights_read_into_huge_pages_hold_the_file_bytes(tmp_path, monkeypatch):
    """The loader reads every tensor's blocks into one buffer that asks for huge pages (with the threshold
    lowered, the tiny model takes that route too): each weight holds exactly its tensor's bytes from the
    file (interleaved ones once read back: `GGUFWeight.raw`), and the model computes exactly what a model read
    into ordinary memory computes."""
    import specwise.kernels.gguf as gk

    path, model_dir = write_tiny_gguf_model(tmp_path, seed=5)
    plain = load_gguf_model(path, model_dir)
    monkeypatch.setattr(gk, "_HUGE_PAGE", 4096)
    model = load_gguf_model(path, model_dir)
    stored = {t.name: np.asarray(t.data).view(np.uint8).reshape(-1) for t in gguf.GGUFReader(path).tensors}
    modules = {name: m for name, m in model.named_modules() if isinstance(m, GGUFLinear)}
    assert modules
    for name, module in modules.items():
        tensor = next(t for t in stored if _hf_name(t) == (name, "weight"))
        assert np.array_equal(module.gguf_weight.raw().data.numpy().reshape(-1), stored[tensor])
    ids = torch.tensor([[5, 9, 14, 5, 9, 30, 31, 2, 7]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, plain(ids).logits)


def test_a_huge_page_buffer_is_ordinary_writable_memory():
    from specwise.kernels.gguf import huge_page_buffer

    for size in (100, (2 << 20) + 12345, 5 << 20):
        buffer = huge_page_buffer(size)
        assert buffer.dtype == torch.uint8 and buffer.shape == (size,) and buffer.is_contiguous()
        buffer.copy_(torch.arange(size, dtype=torch.int64).remainder(251).to(torch.uint8))
        assert torch.equal(buffer[-7:], torch.arange(size - 7, size).remainder(251).to(torch.uint8))
        if size >= 2 << 20 and hasattr(__import__("mmap"), "MADV_HUGEPAGE"):
            assert buffer.data_ptr() % (2 << 20) == 0  # the huge pages' alignment
    buffer = huge_page_buffer(3 << 20)[1:]  # a view keeps its mapping alive
    del buffer


def test_llama_q_and_k_rows_come_back_in_hugging_face_order(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path = write_tiny_gguf(tmp_path / "llama.gguf", layers=2, hidden=64, heads=4, kv_heads=2, ffn=64)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True)).eval()
    reference.save_pretrained(tmp_path / "dense")
    AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name).save_pretrained(tmp_path / "dense")
    model = load_gguf_model(path, tmp_path / "dense")  # tied embeddings: no output.weight in the file
    assert model.lm_head.gguf_weight is model.model.embed_tokens.gguf_weight or torch.equal(
        model.lm_head.gguf_weight.data, model.model.embed_tokens.gguf_weight.data)
    ids = torch.tensor([[3, 40, 41, 100, 7, 250]])
    with torch.inference_mode():
        got, want = model(ids).logits[0], reference(ids).logits[0]
    assert_close_to(got, want)


def test_the_compiled_pass_computes_what_the_layer_by_layer_pass_computes(target, kernel_path):
    compiled, layered = LeanRunner(target.model), LeanRunner(target.model)
    assert compiled.decoder_pass is not None  # every projection of the tiny model is GGUF blocks
    layered.decoder_pass = None  # the same runner as PyTorch operations and one kernel call per matmul
    for runner in (compiled, layered):
        runner.forward([7, 8, 9, 10, 11], logits=False)
    block = [5, 9, 14, 5, 9, 30]
    got = compiled.forward(block, hidden_layers=[0, 1])
    want = layered.forward(block, hidden_layers=[0, 1])
    assert_close_to(got, want)
    assert compiled.last_hidden.shape == layered.last_hidden.shape == (len(block), 2, 256)
    assert torch.allclose(compiled.last_hidden, layered.last_hidden, rtol=0.05, atol=0.05 * float(
        layered.last_hidden.abs().mean()))
    # The cache entries it wrote serve a following pass of the other kind: a tree scored by each.
    parents = [-1, 0, 0, 1]
    assert_close_to(compiled.forward_tree([3, 4, 5, 6], parents), layered.forward_tree([3, 4, 5, 6], parents))


def test_a_block_of_rows_scores_each_row_as_one_token_passes_do(target, kernel_path):
    block = [5, 9, 14, 5, 9, 30, 31, 2]
    runner, alone = LeanRunner(target.model), LeanRunner(target.model)
    runner.forward([7, 8, 9, 10], logits=False)
    alone.forward([7, 8, 9, 10], logits=False)
    together = runner.forward(block)
    one_by_one = torch.cat([alone.forward([token]) for token in block])
    assert torch.equal(together, one_by_one)
    runner.rollback(len(block))  # and a tree: every node as a one-token pass over its own path
    parents = [-1, 0, 0, 1, 2]
    tree = runner.forward_tree([block[0], 11, 12, 13, 14], parents)
    for node, path in enumerate([[block[0]], [block[0], 11], [block[0], 12], [block[0], 11, 13],
                                 [block[0], 12, 14]]):
        alone.rollback(alone.length - 4)
        last = [alone.forward([token]) for token in path][-1][0]
        assert torch.equal(last, tree[node]), node


def cached_entries(runner: LeanRunner) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = runner.cache
    return keys[:, :, :runner.length], values[:, :, :runner.length]


def assert_same_entries(runner: LeanRunner, other: LeanRunner) -> None:
    assert runner.length == other.length
    for mine, theirs in zip(cached_entries(runner), cached_entries(other)):
        assert torch.equal(mine, theirs)


def test_a_scoring_block_of_many_rows_still_scores_row_by_row(target, kernel_path):
    """The score kind runs in the native pass whatever its rows: bitwise the logits and the cache
    entries of one-token passes, for a block of 20 rows too."""
    block = [(7 * i + 2) % 60 for i in range(20)]
    runner, alone = LeanRunner(target.model), LeanRunner(target.model)
    chosen = choose_pass(len(block), True, runner.means)
    assert chosen.kind is PassKind.SCORE and chosen.row_independent
    for each in (runner, alone):
        each.forward([7, 8, 9, 10], logits=False)
    together = runner.forward(block)
    assert torch.equal(together, torch.cat([alone.forward([token]) for token in block]))
    assert_same_entries(runner, alone)


def test_a_prompt_has_the_same_entries_however_it_is_chunked(target, kernel_path):
    """Prefills are row-independent whatever their rows: a prompt of 40 rows read whole, in uneven
    chunks (of more than 16 rows too) or token by token writes the same cache, bit for bit, and what
    follows agrees (tests/test_prefill_invariance.py: longer prompts, the batcher, a cached prefix)."""
    prompt = [(5 * i + 3) % 60 for i in range(40)]
    readings = {"whole": [40], "chunks": [5, 1, 17, 17], "tokens": [1] * 40}
    runners = {}
    for name, sizes in readings.items():
        runner, start = LeanRunner(target.model), 0
        for size in sizes:
            chosen = choose_pass(size, False, runner.means)
            assert chosen.kind is PassKind.PREFILL and chosen.row_independent
            assert runner.forward(prompt[start:start + size], logits=False) is None
            start += size
        runners[name] = runner
    for name in ("whole", "chunks"):
        assert_same_entries(runners[name], runners["tokens"])
    scored = [runner.forward([3, 4, 5]) for runner in runners.values()]
    assert all(torch.equal(logits, scored[0]) for logits in scored)


def test_a_batched_reading_is_repeatable_and_close_but_not_row_independent(target, kernel_path):
    """The negative control that shows the bitwise checks can fail: the same prompt read by the PyTorch
    layers with one batched attention call (what dense models run, and what GGUF prompts of more than 16
    rows ran before) writes the same entries each time, close to the row-by-row reading's, not bitwise."""
    prompt = [(3 * i + 1) % 60 for i in range(40)]
    whole, again, exact = (LeanRunner(target.model) for _ in range(3))
    batched = Pass(PassKind.PREFILL, Implementation.LAYERS, Attention.BATCHED, bf16_prefill=True)
    assert not batched.row_independent
    for runner in (whole, again):
        runner.reset()
        runner._execute(batched, prompt, runner.layout(prompt), False, None)
    exact.forward(prompt, logits=False)
    assert_same_entries(whole, again)
    with pytest.raises(AssertionError):
        assert_same_entries(whole, exact)
    for mine, theirs in zip(cached_entries(whole), cached_entries(exact)):
        assert torch.allclose(mine, theirs, rtol=0.05, atol=0.05 * float(theirs.abs().mean()))
    block = [5, 9, 14, 5]
    assert_close_to(whole.forward(block), exact.forward(block))


@pytest.mark.parametrize("spec", [
    SpecConfig(drafter="ngram", k=4, adaptive=False), SpecConfig(drafter="ngram", k=8, adaptive=False),
    SpecConfig(drafter="draft-model", k=3, adaptive=False), SpecConfig(drafter="draft-model", tree_nodes=6, tree_depth=3),
    SpecConfig(drafter="ngram", tree_shape=(2, 2)),
], ids=lambda s: f"{s.drafter}-{'tree' if s.tree else s.k}")
def test_greedy_speculation_equals_plain_decoding_on_the_stored_blocks(target, drafter, spec):
    decoder = SpecDecoder(target, SpecConfig(drafter="none"), drafter_model=drafter)
    sampling = SamplingParams(max_new_tokens=40, ignore_eos=True)
    for prompt in ([5, 9, 14, 5, 9, 14, 5, 9], [20, 21, 22, 23, 20, 21, 22, 23, 20, 21], [3, 4, 5, 6, 7]):
        plain = decoder.generate(prompt, sampling).token_ids
        fast = decoder.generate(prompt, sampling, spec=spec)
        assert fast.token_ids == plain, prompt
    assert fast.stats.accepted > 0  # drafts were taken, not only the target's own tokens


def test_the_format_setting_picks_the_model(tmp_path):
    from specwise.testing import tiny_model, tiny_tokenizer

    tiny_model(0).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="does not come from a GGUF file"):
        SpecDecoder(str(tmp_path), SpecConfig(drafter="none", target_format="gguf"))
    dense = SpecDecoder(str(tmp_path), SpecConfig(drafter="none"), dtype="float32")
    assert dense.target.format == "dense"  # a model directory has no GGUF source: auto runs it dense


def test_unsupported_block_types_are_named(tmp_path):
    path, model_dir = write_tiny_gguf_model(tmp_path, seed=0, types={"attn_output": "TQ2_0"})
    with pytest.raises(GGUFFormatError, match=r"blk.0.attn_output.weight is stored as TQ2_0, .*supported: "
                                              r"Q4_0, .*IQ4_XS, F32, F16, BF16\); .*--target-format dense"):
        load_gguf_model(path, model_dir)
    with pytest.raises(GGUFFormatError, match="no place in a qwen2 model"):
        _hf_name("blk.0.ssm_conv1d.weight")


@pytest.mark.slow
def test_sampled_output_has_the_distribution_of_the_stored_model(target, drafter):
    exact = exact_distribution(target.model)
    decoder = SpecDecoder(target, SpecConfig(drafter="none"), drafter_model=drafter)
    for spec in (SpecConfig(drafter="draft-model", k=2, verifier="block"), SpecConfig(drafter="ngram", k=2)):
        counts: dict = {}
        for seed in range(SAMPLES):
            sampling = SamplingParams(**{**SAMPLING.__dict__, "seed": seed})
            tokens = tuple(decoder.generate(PROMPT, sampling, spec=spec).token_ids)
            counts[tokens] = counts.get(tokens, 0) + 1
        p = p_value(counts, exact)
        assert p > ALPHA, f"{spec.drafter}: chi-square p = {p:.2e}"


def test_layers_of_one_block_type_fuse_into_one_exact_matmul(tmp_path):
    loaded = tiny_gguf_loaded(tmp_path, seed=2, types={"attn_k": "Q4_K", "ffn_up": "Q4_K"})
    attn, mlp = loaded.model.model.layers[0].self_attn, loaded.model.model.layers[0].mlp
    layer = LeanRunner(loaded.model).layers[0]
    assert [m.gguf_weight.type_name for m in layer.qkv] == ["Q4_K", "Q6_K"]  # q and k fused, v apart
    assert len(layer.gate_up) == 1
    x = torch.randn(5, 256)
    with torch.inference_mode():
        separate = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)
        fused = torch.cat([m(x) for m in layer.qkv], dim=-1)
        assert torch.equal(fused, separate)
        assert torch.equal(layer.gate_up[0](x), torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=-1))


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 500000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
])
def test_rotary_positions_are_bitwise_transformers_own(model_type, rope):
    """The gguf model's rotary module (no transformers modeling import) computes transformers' cos and
    sin bit for bit, for every kind of rope scaling, past the original context too (dynamic rescales)."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    from specwise.gguf.model import RotaryEmbedding

    config = AutoConfig.for_model(model_type, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=64, rope_parameters=dict(rope))
    theirs = (Qwen2RotaryEmbedding if model_type == "qwen2" else LlamaRotaryEmbedding)(config)
    ours = RotaryEmbedding(config)
    x = torch.zeros(1, dtype=torch.float32)
    for positions in (torch.arange(10)[None], torch.arange(50, 200)[None], torch.tensor([[3, 7, 100]])):
        for got, want in zip(ours(x, positions), theirs(x, positions)):
            assert torch.equal(got, want)


def test_running_the_stored_blocks_needs_no_transformers_modeling_code(tmp_path):
    """The lean runner reads the gguf model's own modules: transformers' modeling code (120 MB
    resident, seconds to import) stays unimported; asking for the Hugging Face model builds it over the
    same blocks, with the same logits as before."""
    import subprocess
    import sys

    path, model_dir = write_tiny_gguf_model(tmp_path, seed=2)
    script = f"""
import sys
import torch
from transformers import AutoTokenizer
from specwise import SamplingParams, SpecConfig, SpecDecoder
from specwise.gguf.model import load_gguf_model
from specwise.store.loading import LoadedModel

model = load_gguf_model({str(path)!r}, {str(model_dir)!r})
loaded = LoadedModel("tiny", None, model, AutoTokenizer.from_pretrained({str(model_dir)!r}), format="gguf")
result = SpecDecoder(loaded, SpecConfig(drafter="ngram", k=3)).generate("abcabc", SamplingParams(max_new_tokens=12))
assert len(result.token_ids) > 0
assert "transformers.modeling_utils" not in sys.modules, "modeling code imported"
hf = loaded.hf_model
assert "transformers.modeling_utils" in sys.modules
assert hf.model.layers[0].self_attn.q_proj is model.model.layers[0].self_attn.q_proj  # shared, not copied
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_hugging_face_runner_on_the_stored_blocks_scores_as_the_lean_runner(target):
    """Both runners of the gguf model use the same blocks: the first pass's logits agree to float32
    rounding (the layers are the same kernels; only attention and norm code differ)."""
    ids = [5, 9, 14, 5, 9, 30, 31, 2, 7]
    lean, hf = target.runner("lean"), target.runner("hf")
    got, want = lean.forward(ids), hf.forward(ids)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
