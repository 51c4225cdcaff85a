"""Every architecture the gguf format runs (specwise.runners.architectures), from a file llama.cpp's converter
would write.

Per architecture a tiny random transformers model (GQA, Gemma's head size apart from hidden / heads, a
sliding window shorter than the test's sequence, Gemma 3 with a global layer) is written as a GGUF file
(tests/gguf_files.py: the converter's names, Llama's q/k interleaving, Gemma's norm offset, Phi-3's
fused tensors), with every matrix in F32, Q8_0 (the gguf package's quantizer) or Q4_K (llama.cpp's,
from llama-cpp-python: skipped without it). The reference is transformers' own model of
that architecture holding exactly the file's values (float32, eager attention). Shown:

- the F32 file through the lean runner's PyTorch layers gives the reference's logits to float32
  rounding (as does the lean runner over the dense reference itself), and dropping the architecture's feature (q/k norms, soft-capping, the window, the local
  rotary table) fails that check;
- the quantized files through the native pass and through the PyTorch layers match the reference
  within the kernel's int8 activation rounding, and the native pass without the feature does not;
- the native pass keeps rows independent bitwise (a block scores each row as one-token passes do,
  and the ragged pass of several sequences gives each what its own pass gives);
- greedy speculative decoding (n-gram, draft model) equals plain decoding token for token.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from gguf_files import TOKENS, write_architecture_gguf
from specwise import SamplingParams, SpecConfig, SpecDecoder
from specwise.gguf.model import RotaryEmbedding, load_gguf_model
from specwise.runners.gguf_layers import GGUFLinear
from specwise.runners.native_pass import GGUFDecoderPass
from specwise.runners.lean import LeanRunner
from specwise.store.loading import LoadedModel

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
WINDOW = 8  # shorter than the sequences below, so the sliding layers see less than the full ones
SEQUENCE = list(np.random.default_rng(7).integers(0, len(TOKENS) - 3, 40))


def tiny_config(model_type: str):
    """A small config of the architecture (hidden 256: a K-quant block's width)."""
    from transformers import AutoConfig

    common = dict(vocab_size=len(TOKENS), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  bos_token_id=0, eos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    gemma = dict(head_dim=128, query_pre_attn_scalar=128, sliding_window=WINDOW, tie_word_embeddings=True,
                 hidden_activation="gelu_pytorch_tanh")
    extra = {
        "llama": {}, "qwen2": {},
        "qwen3": dict(head_dim=128),
        # caps small enough to matter for a random model's scores and logits
        "gemma2": dict(gemma, num_hidden_layers=3, attn_logit_softcapping=4.0, final_logit_softcapping=3.0),
        # llama.cpp's pattern: every 6th layer global (layer 5 here), the others local with base 10000
        "gemma3_text": dict(gemma, num_hidden_layers=6, rope_theta=1_000_000.0),
        "phi3": dict(sliding_window=WINDOW),
    }[model_type]
    return AutoConfig.for_model(model_type, **{**common, **extra})


def written(directory, model_type: str, block_type: str, seed: int = 0):
    """(GGUF file, transformers' float32 model of exactly the file's values)."""
    from transformers import AutoModelForCausalLM

    if block_type not in ("F32", "Q8_0"):
        pytest.importorskip("llama_cpp", reason="llama.cpp's quantizer (llama-cpp-python) writes the K-quants")

    torch.manual_seed(seed)
    reference = AutoModelForCausalLM.from_config(tiny_config(model_type), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    offset = 0.0 if model_type.startswith("gemma") else 1.0  # Gemma's modules hold w of x * (1 + w)
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            parameter.normal_(offset if name.endswith("norm.weight") else 0.0, 0.1)
    path = directory / f"{model_type}-{block_type}.gguf"
    stored = write_architecture_gguf(path, reference, block_type)
    missing, unexpected = reference.load_state_dict(stored, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: the embedding's
    return path, reference


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("architectures")
    cache: dict[tuple[str, str], tuple] = {}

    def get(model_type: str, block_type: str):
        if (model_type, block_type) not in cache:
            path, reference = written(directory, model_type, block_type)
            cache[model_type, block_type] = path, reference, load_gguf_model(path)
        return cache[model_type, block_type]
    return get


def reference_logits(reference, ids) -> torch.Tensor:
    with torch.inference_mode():
        return reference(torch.tensor([ids])).logits[0]  # [n, vocab]


def lean_logits(model, ids, *, compiled: bool, change=None) -> torch.Tensor:
    """The lean runner's logits [n, vocab] through the native pass or the PyTorch layers, after `change`
    (a negative control: an architecture's feature dropped from the runner's plan or layers)."""
    runner = LeanRunner(model)
    if change is not None:
        change(runner)
    if compiled:  # the native pass of the (changed) plan and layers
        runner.decoder_pass = GGUFDecoderPass.build(runner.layers, model.config, runner.plan)
        assert runner.decoder_pass is not None  # every projection is GGUF blocks
    else:
        runner.decoder_pass = None  # the PyTorch layers
    runner.reset()
    return runner.forward(ids)


def assert_float_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Float32 rounding only: another order of the same sums."""
    torch.testing.assert_close(got, want, rtol=0, atol=2e-4 * float(want.std()))


def assert_close_to(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within the error of the kernel's int8 activations (as tests/test_gguf_model.py): mean difference
    under 4 % of the logits' spread, single logits within 25 %, the argmax kept almost everywhere (a random
    model's top logits are often near ties: 90-100 % kept here)."""
    spread = want.std()
    assert (got - want).abs().mean() < 0.04 * spread
    assert (got - want).abs().max() < 0.25 * spread
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.85


def _without_qk_norms(runner):
    runner.layers = [replace(layer, q_norm=None, k_norm=None) for layer in runner.layers]


def _without_window(runner):
    runner.plan = replace(runner.plan, windows=(None,) * len(runner.layers))


def _one_rotary_table(runner):  # every layer reads the first table (the global one)
    runner.plan = replace(runner.plan, rope_table=(runner.plan.rope_types.index("full_attention"),) * len(
        runner.layers))


def _without_attention_softcap(runner):
    runner.plan = replace(runner.plan, attention_softcap=None)


def _without_final_softcap(runner):
    runner.plan = replace(runner.plan, final_softcap=None)


def _without_sandwich_norms(runner):
    runner.layers = [replace(layer, attn_out_norm=None, mlp_out_norm=None) for layer in runner.layers]


def _without_embedding_scale(runner):
    runner.embedding_scale = None


# What each architecture adds to the Llama layer: without it, the comparison must fail.
FEATURES = {
    "qwen3": [_without_qk_norms],
    "gemma2": [_without_window, _without_attention_softcap, _without_final_softcap, _without_sandwich_norms,
               _without_embedding_scale],
    "gemma3_text": [_without_qk_norms, _without_window, _one_rotary_table, _without_embedding_scale],
    "phi3": [_without_window],
}


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_the_f32_file_gives_transformers_own_logits(files, model_type):
    path, reference, model = files(model_type, "F32")
    want = reference_logits(reference, SEQUENCE)
    assert_float_close(lean_logits(model, SEQUENCE, compiled=False), want)
    for change in FEATURES.get(model_type, ()):
        with pytest.raises(AssertionError):  # the feature matters here: without it the same check fails
            assert_float_close(lean_logits(model, SEQUENCE, compiled=False, change=change), want)
    # The file's model in transformers' own code (hf_model: the same modules) agrees too, and so does the
    # lean runner over transformers' dense model itself (its Gemma norms hold w, not 1 + w).
    with torch.inference_mode():
        assert_float_close(model(torch.tensor([SEQUENCE])).logits[0], want)
    assert_float_close(lean_logits(reference, SEQUENCE, compiled=False), want)


def test_llama3_rope_frequencies_come_from_the_files_rope_freqs(tmp_path):
    """Llama 3.1+ files hold their rope scaling as per-frequency divisors (rope_freqs.weight): the logits are
    those of transformers' llama3 rope scaling, which the plain frequencies do not give."""
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama")
    config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            parameter.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.1)
    path = tmp_path / "llama3.gguf"
    reference.load_state_dict(write_architecture_gguf(path, reference))
    model = load_gguf_model(path)
    want = reference_logits(reference, SEQUENCE)
    assert_float_close(lean_logits(model, SEQUENCE, compiled=False), want)
    with torch.inference_mode():
        assert_float_close(model(torch.tensor([SEQUENCE])).logits[0], want)  # transformers' code, our rotary
    model.model.rotary_emb = RotaryEmbedding(model.config)  # a control: the plain frequencies of the config
    with pytest.raises(AssertionError):
        assert_float_close(lean_logits(model, SEQUENCE, compiled=False), want)


def test_another_models_logits_fail_the_check(files):
    """For the architectures without a feature of their own: the check can fail (another model's file)."""
    _, reference, _ = files("llama", "F32")
    _, _, other = files("qwen2", "F32")
    with pytest.raises(AssertionError):
        assert_float_close(lean_logits(other, SEQUENCE, compiled=False), reference_logits(reference, SEQUENCE))


@pytest.mark.parametrize("block_type", ["Q8_0", "Q4_K"])
@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_the_stored_blocks_match_transformers_own_logits_on_both_paths(files, model_type, block_type):
    path, reference, model = files(model_type, block_type)
    assert {m.gguf_weight.type_name for m in model.modules() if isinstance(m, GGUFLinear)} == {block_type}
    want = reference_logits(reference, SEQUENCE)
    compiled = lean_logits(model, SEQUENCE, compiled=True)
    assert_close_to(compiled, want)
    assert_close_to(lean_logits(model, SEQUENCE, compiled=False), want)
    for change in FEATURES.get(model_type, ()):
        with pytest.raises(AssertionError):  # the native pass without the feature fails the check
            assert_close_to(lean_logits(model, SEQUENCE, compiled=True, change=change), want)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_the_compiled_pass_scores_each_row_as_one_token_passes_do(files, model_type, kernel_path):
    _, _, model = files(model_type, "Q8_0")
    block, whole, single = SEQUENCE[20:26], LeanRunner(model), LeanRunner(model)
    for runner in (whole, single):
        runner.forward(SEQUENCE[:20], logits=False)  # past the window
    together = whole.forward(block)
    alone = torch.cat([single.forward([token]) for token in block])
    assert torch.equal(together, alone)
    keys, values = whole.cache
    keys_alone, values_alone = single.cache
    assert torch.equal(keys[:, :, :26], keys_alone[:, :, :26])
    assert torch.equal(values[:, :, :26], values_alone[:, :, :26])


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_the_ragged_pass_gives_each_sequence_what_its_own_pass_gives(files, model_type):
    """Continuous batching's one pass over several sequences' blocks (a chain and a tree, caches past the
    window): each sequence's logits bitwise those of its own pass."""
    from specwise.runners.ragged import Block, can_score_together, score_together

    _, _, model = files(model_type, "Q8_0")
    together, alone = [LeanRunner(model) for _ in range(2)], [LeanRunner(model) for _ in range(2)]
    for runners in (together, alone):
        runners[0].forward(SEQUENCE[:15], logits=False)
        runners[1].forward(SEQUENCE[5:25], logits=False)
    blocks = [Block(SEQUENCE[30:34]), Block(SEQUENCE[34:38], parents=[-1, 0, 0, 1])]
    assert can_score_together(together)
    got = score_together(together, blocks)
    want = [alone[0].forward(blocks[0].ids), alone[1].forward_tree(blocks[1].ids, blocks[1].parents)]
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_greedy_speculation_equals_plain_decoding(files, model_type):
    path, _, model = files(model_type, "Q4_K")
    target = LoadedModel(name=f"tiny-{model_type}", path=path, model=model, tokenizer=None, format="gguf")
    decoder = SpecDecoder(target, SpecConfig(drafter="none"), drafter_model=target)
    sampling = SamplingParams(max_new_tokens=30, ignore_eos=True)
    prompts = ([int(t) for t in SEQUENCE[:12]], [5, 9, 14, 5, 9, 14, 5, 9])
    for spec in (SpecConfig(drafter="ngram", k=4, adaptive=False), SpecConfig(drafter="draft-model", k=3, adaptive=False),
                 SpecConfig(drafter="draft-model", tree_nodes=6, tree_depth=3)):
        for prompt in prompts:
            plain = decoder.generate(prompt, sampling).token_ids
            fast = decoder.generate(prompt, sampling, spec=spec)
            assert fast.token_ids == plain, (spec, prompt)
        if spec.drafter == "draft-model":  # the target drafting for itself: its drafts are taken
            assert fast.stats.accepted > 0


def test_the_compiled_step_refuses_layers_beyond_llamas(files):
    """torch.compile's scoring step (specwise.runners.torch_step) keeps the Llama layer only: Gemma is refused
    by name, before anything is compiled."""
    from specwise.runners.torch_step import CompiledLeanRunner
    from specwise.runners.lean import UnsupportedModelError

    _, reference, _ = files("gemma2", "F32")
    with pytest.raises(UnsupportedModelError, match="compile_step runs Llama-style layers only, not gemma2's"):
        CompiledLeanRunner(reference)


def test_every_architecture_the_metadata_reader_knows_runs_and_others_are_refused_by_name(tmp_path):
    from gguf_files import write_model_gguf
    from specwise.runners.architectures import ARCHITECTURES as SPECS
    from specwise.gguf.config import ARCHITECTURE_KEYS
    from specwise.gguf.file import GGUFFormatError

    assert sorted(keys.model_type for keys in ARCHITECTURE_KEYS.values()) == sorted(SPECS) == sorted(ARCHITECTURES)
    with pytest.raises(GGUFFormatError, match="GGUF architecture 'mamba' is not one specwise reads"):
        load_gguf_model(write_model_gguf(tmp_path / "mamba.gguf", "mamba"))


def test_long_context_rotary_factors_are_refused_by_name(tmp_path):
    """Phi-3's long-context files switch rotary factors by the sequence's length: refused on load, and named
    by `models inspect`, with the dense format as the fix."""
    from transformers import AutoModelForCausalLM

    from specwise.gguf.file import GGUFFormatError
    from specwise.gguf.describe import inspect_gguf

    path = tmp_path / "long.gguf"
    write_architecture_gguf(path, AutoModelForCausalLM.from_config(tiny_config("phi3")),
                            extra={"rope_factors_long.weight": np.ones(32), "rope_factors_short.weight": np.ones(32)})
    with pytest.raises(GGUFFormatError, match="holds rope_factors_long.weight .*use the dense format"):
        load_gguf_model(path)
    report = inspect_gguf(path)
    assert not report.runs_as_stored and report.problems[0].startswith("rope_factors_long.weight: long-context")
