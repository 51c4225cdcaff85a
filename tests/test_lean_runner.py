"""LeanRunner against the Hugging Face runner, tree scoring and compaction, and the bf16 linear kernel.

The lean runner reimplements the forward pass of Llama/Qwen2 models, so the
reference for every logit it returns is HFRunner (or Hugging Face generate())
over the same weights, in float32 where the two must agree to rounding
(docs/DESIGN.md, "Numerics"); bfloat16 gets a loose sanity check only.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM

import specwise.kernels as kernels
from specwise import SamplingParams, SpecConfig, SpecDecoder, SpeculativeEngine
from specwise.drafters import DraftModelDrafter
from specwise.runners.lean import LeanRunner, UnsupportedModelError
from specwise.store.loading import LoadedModel
from specwise.runners.int8 import quantize_int8
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_config, tiny_model

from helpers import CorruptingDrafter, hf_greedy


# -- models -----------------------------------------------------------------------------------

def qwen2(seed: int, dtype: torch.dtype = torch.float32, layers: int = 2, **overrides) -> Qwen2ForCausalLM:
    config = tiny_config(layers=layers)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(dtype).eval()


def llama(seed: int, **overrides) -> LlamaForCausalLM:
    options = dict(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                   initializer_range=0.3)
    options.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**options)).eval()


MODELS = {
    "qwen2": lambda: tiny_model(seed=0),
    # head_dim 16 * 4 heads != hidden 32; one kv head for 4 query heads; output layer = embedding
    "qwen2-head_dim-mqa-tied": lambda: qwen2(3, head_dim=16, num_key_value_heads=1, tie_word_embeddings=True),
    "qwen2-mha-3-layers": lambda: qwen2(4, layers=3, num_key_value_heads=4),
    "llama": lambda: llama(0),
    # biases everywhere (the MLP then runs unfused) and llama3 rope scaling
    "llama-bias-rope-scaling": lambda: llama(1, attention_bias=True, mlp_bias=True, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}),
}


def started(runner):
    runner.reset()
    return runner


def assert_same_logits(got: torch.Tensor, expected: torch.Tensor, rel: float = 1e-4) -> None:
    assert got.shape == expected.shape and got.dtype == torch.float32
    error = (got - expected).abs().max().item() / expected.abs().max().item()
    assert error <= rel, f"relative max error {error:.3g} > {rel}"


def random_ids(generator: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=generator).tolist()


# -- 1, 2: logits equal Hugging Face's in float32 -----------------------------------------------

def test_model_variants_are_what_they_claim():
    tied = MODELS["qwen2-head_dim-mqa-tied"]()
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert tied.model.layers[0].self_attn.q_proj.out_features == 64 != tied.config.hidden_size
    biased = LeanRunner(MODELS["llama-bias-rope-scaling"]())
    layer = biased.layers[0]  # biased projections fuse too: one matmul with the biases side by side
    assert len(layer.qkv) == 1 and layer.qkv[0].bias is not None
    assert len(layer.gate_up) == 1 and layer.gate_up[0].bias is not None
    plain = LeanRunner(MODELS["llama"]()).layers[0]
    assert len(plain.gate_up) == 1 and plain.gate_up[0].bias is None


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_equal_hf_through_blocks_rollback_and_cache_growth(name):
    model = MODELS[name]()
    vocab = model.config.vocab_size
    hf, lean = started(HFRunner(model)), started(LeanRunner(model, capacity=16))
    generator = torch.Generator().manual_seed(1)

    def both(ids):
        expected = hf.forward(ids)
        assert_same_logits(lean.forward(ids), expected)
        assert lean.length == hf.length
        return expected

    both(random_ids(generator, 7, vocab))  # prefill
    both(random_ids(generator, 1, vocab))
    both(random_ids(generator, 1, vocab))
    block = random_ids(generator, 5, vocab)
    first = both(block)
    for n in (1, 3, 5):  # rollback + refeed the same tokens: the same logits again
        hf.rollback(n)
        lean.rollback(n)
        again = both(block[5 - n:])
        torch.testing.assert_close(again, first[5 - n:], rtol=1e-5, atol=1e-5)
    hf.rollback(4)
    lean.rollback(4)
    both(random_ids(generator, 3, vocab))  # rollback + different tokens
    assert lean.length < 16
    both(random_ids(generator, 12, vocab))  # past the initial capacity of 16
    both(random_ids(generator, 1, vocab))
    hf.rollback(6)
    lean.rollback(6)
    both(random_ids(generator, 30, vocab))  # and past the doubled one
    for _ in range(3):
        both(random_ids(generator, 1, vocab))
    assert lean.length > 32 and lean._capacity >= lean.length > 16


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_prefill_without_logits_still_fills_the_cache(name):
    model = MODELS[name]()
    vocab = model.config.vocab_size
    hf, lean = started(HFRunner(model)), started(LeanRunner(model, capacity=16))
    generator = torch.Generator().manual_seed(2)
    for n in (9, 6, 11):  # chunks, the last of them growing the cache
        ids = random_ids(generator, n, vocab)
        hf.forward(ids)
        assert lean.forward(ids, logits=False) is None
        assert lean.length == hf.length
    ids = random_ids(generator, 4, vocab)
    assert_same_logits(lean.forward(ids), hf.forward(ids))
    assert lean.forward([], logits=False) is None and lean.forward([]).shape == (0, vocab)


def test_context_window_and_bad_ids_are_refused_without_corrupting_the_cache():
    model = tiny_model(seed=0, max_positions=24)
    hf, lean = started(HFRunner(model)), started(LeanRunner(model, capacity=16))
    hf.forward(list(range(1, 21)))
    lean.forward(list(range(1, 21)))
    with pytest.raises(ValueError, match="token ids must be in"):
        lean.forward([5, model.config.vocab_size])
    with pytest.raises(ValueError, match="token ids must be in"):
        lean.forward([-1])
    assert lean.length == 20
    assert_same_logits(lean.forward([7, 8, 9, 10]), hf.forward([7, 8, 9, 10]))  # exactly fills the window
    with pytest.raises(ValueError, match="exceeds the model's window of 24"):
        lean.forward([1])
    with pytest.raises(ValueError, match="cannot roll back 25"):
        lean.rollback(25)


# -- 3: tree scoring and compaction ------------------------------------------------------------

TREES = {
    "single": [-1],
    "chain": [-1, 0, 1, 2],
    "siblings": [-1, -1, -1],
    "mixed": [-1, 0, 0, 1, -1, 4, 3, 2, 1],
}


def path_to(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("name", ["qwen2", "qwen2-head_dim-mqa-tied", "llama"])
def test_tree_nodes_get_the_logits_of_their_own_path(name, tree):
    model = MODELS[name]()
    parents = TREES[tree]
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(3)
    context = random_ids(generator, 13, vocab)
    ids = random_ids(generator, len(parents), vocab)
    lean = started(LeanRunner(model, capacity=16))  # 13 + 9 nodes: the tree pass grows the cache
    lean.forward(context, logits=False)
    scored = lean.forward_tree(ids, parents)  # [n, vocab]
    assert scored.shape == (len(parents), vocab) and lean.length == len(context) + len(parents)
    reference = started(HFRunner(model))
    reference.forward(context, logits=False)
    for node in range(len(parents)):
        path = [ids[i] for i in path_to(parents, node)]
        expected = reference.forward(path)[-1]
        reference.rollback(len(path))
        assert_same_logits(scored[node], expected, rel=1e-5)


@pytest.mark.parametrize("split", [1, 2, 4, 7])
def test_growing_a_tree_in_parts_equals_scoring_it_at_once(split):
    """extend=True: a drafter feeds each level once; the logits must not depend on the split."""
    model = MODELS["qwen2"]()
    parents = TREES["mixed"]
    generator = torch.Generator().manual_seed(5)
    context = random_ids(generator, 11, model.config.vocab_size)
    ids = random_ids(generator, len(parents), model.config.vocab_size)
    whole = started(LeanRunner(model, capacity=16))
    whole.forward(context, logits=False)
    expected = whole.forward_tree(ids, parents)
    grown = started(LeanRunner(model, capacity=16))
    grown.forward(context, logits=False)
    first = grown.forward_tree(ids[:split], parents[:split])
    rest = grown.forward_tree(ids[split:], parents[split:], extend=True)
    assert_same_logits(torch.cat([first, rest]), expected, rel=1e-5)
    assert grown.length == len(context) + len(parents)
    grown.rollback(1)
    with pytest.raises(ValueError, match="extend=True needs the tree"):
        grown.forward_tree(ids[:1], [0], extend=True)  # the cache no longer ends with that tree


@pytest.mark.parametrize("accepted_node", [None, 0, 3, 5, 8])
@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_keep_accepted_path_continues_like_feeding_the_path_alone(name, accepted_node):
    model = MODELS[name]()
    parents = TREES["mixed"]
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(4)
    context = random_ids(generator, 10, vocab)
    ids = random_ids(generator, len(parents), vocab)
    path = [] if accepted_node is None else path_to(parents, accepted_node)
    lean = started(LeanRunner(model, capacity=16))
    lean.forward(context, logits=False)
    lean.forward_tree(ids, parents)
    lean.keep(len(context), path)
    assert lean.length == len(context) + len(path)
    reference = started(HFRunner(model))
    reference.forward(context + [ids[i] for i in path], logits=False)
    for n in (1, 4, 1):
        continuation = random_ids(generator, n, vocab)
        assert_same_logits(lean.forward(continuation), reference.forward(continuation))
    # A second tree on the compacted cache scores like the first.
    second = random_ids(generator, 3, vocab)
    scored = lean.forward_tree(second, [-1, 0, -1])
    assert_same_logits(scored[1], reference.forward(second[:2])[-1], rel=1e-5)
    reference.rollback(2)
    assert_same_logits(scored[2], reference.forward([second[2]])[-1], rel=1e-5)
    lean.rollback(3)  # reject the whole second tree
    reference.rollback(1)
    assert lean.length == reference.length
    assert_same_logits(lean.forward([1, 2]), reference.forward([1, 2]))


def test_keep_works_outside_inference_mode_on_a_cache_made_inside_it():
    model = tiny_model(seed=0)
    lean = LeanRunner(model)  # no reset(): the first forward allocates the cache, in inference mode
    lean.forward([1, 2, 3], logits=False)
    lean.forward_tree([4, 5, 6], [-1, -1, 1])
    lean.keep(3, [1, 2])
    reference = started(HFRunner(model))
    reference.forward([1, 2, 3, 5, 6], logits=False)
    assert_same_logits(lean.forward([7, 8]), reference.forward([7, 8]))


def test_bad_trees_and_keep_indices_are_refused():
    lean = started(LeanRunner(tiny_model(seed=0)))
    lean.forward([1, 2, 3], logits=False)
    for parents in ([0], [-1, 1], [-1, 2, 0], [-2], [-1, 0, 5]):
        with pytest.raises(ValueError, match="must be -1 or an earlier node"):
            lean.forward_tree([4] * len(parents), parents)
        assert lean.length == 3
    with pytest.raises(ValueError, match="2 tree tokens but 3 parents"):
        lean.forward_tree([4, 5], [-1, 0, 0])
    with pytest.raises(ValueError, match="2 tree tokens but 1 parents"):
        lean.forward_tree([4, 5], [-1])
    assert lean.length == 3
    lean.forward_tree([4, 5], [-1, -1])
    with pytest.raises(ValueError, match="fall outside"):
        lean.keep(3, [0, 2])
    with pytest.raises(ValueError, match="fall outside"):
        lean.keep(3, [-1])
    with pytest.raises(ValueError, match="cannot compact from 6"):
        lean.keep(6, [])


# -- 4: the engine on lean runners equals Hugging Face generate() --------------------------------

PROMPTS = [[5, 9, 14, 20, 33], [40, 41, 42, 40, 41, 42, 40, 41], [7]]


def without_eos(model) -> LoadedModel:
    """No tokenizer and no EOS: every generation runs its full length."""
    model.generation_config.eos_token_id = None
    return LoadedModel(name=f"tiny-{id(model)}", path=None, model=model, tokenizer=None)


@pytest.fixture(scope="module")
def target() -> LoadedModel:
    return without_eos(tiny_model(seed=0))


def decode_all(decoder: SpecDecoder, max_new: int = 40):
    results = [decoder.generate(prompt, SamplingParams(max_new_tokens=max_new)) for prompt in PROMPTS]
    expected = [hf_greedy(decoder.target.model, prompt, max_new, eos=False) for prompt in PROMPTS]
    for result, tokens in zip(results, expected):
        assert result.token_ids == tokens
    return results


@pytest.mark.parametrize("drafter", ["draft-model-self", "draft-model-other", "int8-draft-model"])
def test_spec_decoder_on_lean_runners_equals_hf_generate(target, drafter):
    if drafter == "draft-model-self":
        drafter_model = target
    elif drafter == "draft-model-other":
        drafter_model = without_eos(tiny_model(seed=1))
    else:  # its linear layers are not nn.Linear: the lean runner calls the modules themselves
        drafter_model = without_eos(quantize_int8(copy.deepcopy(tiny_model(seed=0))))
    spec = SpecConfig(drafter="draft-model", runner="lean", k=4, adaptive=False)
    decoder = SpecDecoder(target, spec, drafter_model=drafter_model)
    draft_runner = decoder.drafter_for(spec).runner
    assert isinstance(decoder.runner, LeanRunner) and isinstance(draft_runner, LeanRunner)
    results = decode_all(decoder)
    rate = sum(r.stats.accepted for r in results) / sum(r.stats.proposed for r in results)
    if drafter == "draft-model-self":
        assert rate == 1.0
    if drafter == "int8-draft-model":
        assert len(draft_runner.layers[0].qkv) == 3 and draft_runner.layers[0].gate_up is None  # run as they are
        assert 0.3 < rate < 1.0  # partial acceptance: rollbacks on both runners


def test_spec_decoder_ngram_on_lean_runner_equals_hf_generate(target):
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", runner="lean", k=4, ngram_max=3, adaptive=False))
    assert isinstance(decoder.runner, LeanRunner)
    results = decode_all(decoder, max_new=60)
    assert sum(r.stats.accepted for r in results) > 0  # the tiny model loops: lookups get accepted


@pytest.mark.parametrize("position", [0, 2])
def test_engine_partial_acceptance_on_lean_runners(target, position):
    model = target.model
    drafter = CorruptingDrafter(DraftModelDrafter(LeanRunner(model), model.config.vocab_size),
                                position, model.config.vocab_size)
    engine = SpeculativeEngine(LeanRunner(model, capacity=16), drafter, SpecConfig(k=4, adaptive=False))
    for prompt in PROMPTS[:2]:
        result = engine.generate(prompt, SamplingParams(max_new_tokens=40))
        assert result.token_ids == hf_greedy(model, prompt, 40, eos=False)
        assert result.stats.accepted_at[position] == 0 < result.stats.proposed_at[position]


def test_int8_model_logits_on_lean_equal_hf():
    model = quantize_int8(copy.deepcopy(tiny_model(seed=2)))
    hf, lean = started(HFRunner(model)), started(LeanRunner(model, capacity=16))
    generator = torch.Generator().manual_seed(5)
    for n in (6, 1, 4, 12, 1):
        ids = random_ids(generator, n, model.config.vocab_size)
        assert_same_logits(lean.forward(ids), hf.forward(ids))


# -- 5: the bfloat16 kernel ----------------------------------------------------------------------

@pytest.fixture
def kernel(monkeypatch):
    reason = kernels._unavailable_reason()
    if reason is not None:
        pytest.skip(f"the bf16 linear kernel cannot be used on this machine: {reason}")
    assert kernels.kernel_status().startswith("ready")  # the machine qualifies: then it must build and load
    # Every row count through the kernel, even on a CPU where PyTorch takes the larger ones.
    monkeypatch.setitem(kernels._STATE, "rows", None)


def forbid_pytorch_linear(monkeypatch, why: str) -> None:
    """Make any F.linear call from specwise.kernels fail: the kernel must take this input."""
    class NoTorch:
        @staticmethod
        def linear(*args):
            raise AssertionError(f"F.linear called for {why}")

    monkeypatch.setattr(kernels, "F", NoTorch)


def float64_reference(x, weight, bias):
    """F.linear in float64 of the same bf16 values, and the sum of |terms| (for the float32 error bound)."""
    x64, w64 = x.double(), weight.double()
    b64 = None if bias is None else bias.double()
    reference = F.linear(x64, w64, b64)
    magnitude = F.linear(x64.abs(), w64.abs(), None if b64 is None else b64.abs())
    return reference, magnitude


def assert_within_bf16_rounding(y, x, weight, bias):
    reference, magnitude = float64_reference(x, weight, bias)
    assert y.dtype == torch.bfloat16 and y.shape == reference.shape
    k = weight.shape[1]
    # one rounding to bf16 (2^-8 relative, doubled for slack) + float32 accumulation of k terms
    bound = 2 ** -7 * reference.abs() + 2 * k * 2 ** -24 * magnitude + 1e-30
    excess = ((y.double() - reference).abs() / bound).max().item()
    assert excess <= 1, f"error {excess:.2f} x the bf16 bound"


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n", [1, 37, 64, 1000])
def test_kernel_matches_float64_within_bf16_rounding(kernel, n, bias):
    generator = torch.Generator().manual_seed(n)
    for k in (8, 64, 200):
        weight = torch.randn(n, k, generator=generator).bfloat16()
        b = torch.randn(n, generator=generator).bfloat16() if bias else None
        for m in range(1, 21):
            x = torch.randn(m, k, generator=generator).bfloat16()
            assert_within_bf16_rounding(kernels.linear(x, weight, b), x, weight, b)


def test_kernel_on_3d_and_non_contiguous_inputs(kernel):
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(37, 64, generator=generator).bfloat16()
    bias = torch.randn(37, generator=generator).bfloat16()
    for shape in ((1, 1, 64), (2, 5, 64), (3, 7, 64)):
        x = torch.randn(*shape, generator=generator).bfloat16()
        y = kernels.linear(x, weight, bias)
        assert y.shape == (*shape[:-1], 37)
        assert_within_bf16_rounding(y, x, weight, bias)
    x = torch.randn(64, 6, generator=generator).bfloat16().t()  # [6, 64], not contiguous
    assert_within_bf16_rounding(kernels.linear(x, weight), x, weight, None)
    assert kernels.linear(torch.empty(0, 64, dtype=torch.bfloat16), weight).shape == (0, 37)


def test_kernel_is_the_path_for_bf16_and_pytorch_for_the_rest(kernel, monkeypatch):
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(40, 64, generator=generator).bfloat16()
    x = torch.randn(3, 64, generator=generator).bfloat16()
    odd_k = torch.randn(40, 12, generator=generator).bfloat16()  # K not a multiple of 8
    x12 = torch.randn(3, 12, generator=generator).bfloat16()
    # Non-bf16 and odd-K inputs go to F.linear unchanged: bit for bit.
    assert torch.equal(kernels.linear(x.float(), weight.float()), F.linear(x.float(), weight.float()))
    assert torch.equal(kernels.linear(x12, odd_k), F.linear(x12, odd_k))

    forbid_pytorch_linear(monkeypatch, "a bf16 input the kernel should take")
    assert_within_bf16_rounding(kernels.linear(x, weight), x, weight, None)


def test_native_bf16_cpus_leave_many_rows_to_pytorch(kernel, monkeypatch):
    generator = torch.Generator().manual_seed(10)
    weight = torch.randn(40, 64, generator=generator).bfloat16()
    monkeypatch.setitem(kernels._STATE, "rows", kernels.NATIVE_BF16_KERNEL_ROWS)
    few, many = (torch.randn(m, 64, generator=generator).bfloat16() for m in (4, 5))
    assert torch.equal(kernels.linear(many, weight), F.linear(many, weight))  # PyTorch's, bit for bit
    assert "up to 4 rows" in kernels.kernel_status()

    forbid_pytorch_linear(monkeypatch, "rows the kernel should take")
    assert_within_bf16_rounding(kernels.linear(few, weight), few, weight, None)
    monkeypatch.setitem(kernels._STATE, "rows", None)  # an AVX2-only CPU: the kernel takes every row count
    assert_within_bf16_rounding(kernels.linear(many, weight), many, weight, None)


def test_non_contiguous_weight_still_gives_the_linear(kernel):
    generator = torch.Generator().manual_seed(8)
    weight = torch.randn(64, 40, generator=generator).bfloat16().t()  # [40, 64], a transposed view
    x = torch.randn(3, 64, generator=generator).bfloat16()
    assert_within_bf16_rounding(kernels.linear(x, weight), x, weight, None)


def test_fallback_when_disabled_gives_pytorchs_result(monkeypatch):
    monkeypatch.setattr(kernels, "_STATE", {})  # forget the loaded module for this test only
    monkeypatch.setenv("SPECWISE_KERNELS", "0")
    assert kernels.bf16_linear_module() is None
    assert kernels.kernel_status() == "unavailable: disabled by SPECWISE_KERNELS=0"
    generator = torch.Generator().manual_seed(9)
    weight = torch.randn(37, 64, generator=generator).bfloat16()
    bias = torch.randn(37, generator=generator).bfloat16()
    x = torch.randn(2, 5, 64, generator=generator).bfloat16()
    assert torch.equal(kernels.linear(x, weight, bias), F.linear(x, weight, bias))


def test_failed_build_falls_back_and_says_why(monkeypatch):
    def broken_build():
        raise RuntimeError("compiling...\nerror: something went wrong")

    monkeypatch.setattr(kernels, "_STATE", {})
    monkeypatch.setattr(kernels, "_unavailable_reason", lambda: None)
    monkeypatch.setattr(kernels, "_build", broken_build)
    status = kernels.kernel_status()
    assert status.startswith("unavailable: build failed: ") and "error: something went wrong" in status
    assert "compiling" not in status  # the last line of the compiler's output, not all of it
    x, weight = torch.randn(4, 16).bfloat16(), torch.randn(8, 16).bfloat16()
    assert torch.equal(kernels.linear(x, weight), F.linear(x, weight))


# -- 6: choosing a runner --------------------------------------------------------------------------

def test_runner_kinds_and_unsupported_architectures():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2)).eval()
    loaded = LoadedModel(name="tiny-gpt2", path=None, model=gpt2, tokenizer=None)
    with pytest.raises(UnsupportedModelError, match="not 'gpt2'; use runner='hf'"):
        loaded.runner("lean")
    assert type(loaded.runner("auto")) is HFRunner
    assert type(loaded.runner("hf")) is HFRunner
    with pytest.raises(ValueError, match="runner must be 'auto', 'hf' or 'lean'; got 'fast'"):
        loaded.runner("fast")

    qwen = LoadedModel(name="tiny", path=None, model=tiny_model(seed=0), tokenizer=None)
    assert type(qwen.runner("auto")) is LeanRunner and type(qwen.runner("lean")) is LeanRunner
    assert type(qwen.runner("hf")) is HFRunner

    gelu = LoadedModel(name="gelu", path=None, model=llama(0, hidden_act="gelu"), tokenizer=None)
    with pytest.raises(UnsupportedModelError, match="SiLU.*use runner='hf'"):
        gelu.runner("lean")
    assert type(gelu.runner("auto")) is HFRunner

    # Sliding-window layers run in the lean runner (a window narrows the entries a row sees) as transformers
    # runs them: the same logits over a sequence three windows long, which full attention does not give.
    sliding_model = qwen2(0, use_sliding_window=True, sliding_window=4, max_window_layers=0,
                          layer_types=["sliding_attention"] * 2)
    sliding = LoadedModel(name="sliding", path=None, tokenizer=None, model=sliding_model)
    assert type(sliding.runner("auto")) is LeanRunner
    ids = list(range(3, 15))
    got = started(sliding.runner("lean")).forward(ids)
    with torch.inference_mode():
        want = sliding_model(torch.tensor([ids])).logits[0]
        full = qwen2(0)(torch.tensor([ids])).logits[0]
    assert torch.allclose(got, want, atol=1e-4) and not torch.allclose(got, full, atol=1e-2)


# -- 7: bfloat16, loosely -------------------------------------------------------------------------

@pytest.mark.parametrize("hidden", [32, 64])
def test_bfloat16_logits_close_to_hf(hidden):
    model = tiny_model(seed=0, dtype=torch.bfloat16, hidden=hidden)
    hf, lean = started(HFRunner(model)), started(LeanRunner(model, capacity=16))
    generator = torch.Generator().manual_seed(10)
    agree = total = 0
    for n in (12, 1, 1, 6, 20, 1):
        ids = random_ids(generator, n, model.config.vocab_size)
        expected, got = hf.forward(ids), lean.forward(ids)
        spread = (expected.max() - expected.min()).item()
        assert (got - expected).abs().max().item() <= 0.05 * spread
        agree += int((got.argmax(-1) == expected.argmax(-1)).sum())
        total += n
    assert agree >= 0.9 * total
