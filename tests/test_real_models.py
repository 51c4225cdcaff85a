"""The real default pair (Qwen2.5-Coder 1.5B target, 0.5B drafter), greedy.

Dense (bfloat16): specwise's output must equal the target's own plain greedy decoding
(Hugging Face generate) token for token; a divergence is accepted only when it is a
numerical near-tie at the first differing position (specwise.numerics), and reported.
GGUF blocks as stored: speculative output must equal specwise's own plain decoding of
that target exactly, with no tolerance (every scoring pass keeps rows independent).
The files alone: config and tokenizer read from the GGUF metadata equal what transformers
derives and what the dense copy holds; nothing is converted for the gguf format; Gemma 3 runs as
stored, as transformers runs the same modules. Skipped when the models are not prepared, except in CI
(SPECWISE_REQUIRE_REAL_MODELS=1).
"""

import os

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpecDecoder
from specwise.api import eos_token_ids
from specwise.errors import ModelError
from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET
from specwise.store.prepare import resolve_model
from specwise.numerics import check_identity

pytestmark = pytest.mark.real_models

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "What is the capital of France? Answer in one sentence.",
    "Explain in two sentences what a hash table is.",
]
MAX_NEW = 48


def _require(name):
    try:
        resolve_model(name)
    except ModelError as error:
        if os.environ.get("SPECWISE_REQUIRE_REAL_MODELS") == "1":
            pytest.fail(f"real models required here but not ready: {error}")
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def decoder():
    _require(DEFAULT_TARGET)
    _require(DEFAULT_DRAFTER)
    torch.set_num_threads(os.cpu_count() or 1)
    yield SpecDecoder(DEFAULT_TARGET, SpecConfig(drafter="draft-model", k=5, target_format="dense"),
                      drafter_model=DEFAULT_DRAFTER)
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def references(decoder):
    model = decoder.target.model
    out = {}
    for prompt in PROMPTS:
        ids = decoder.encode(prompt)
        generated = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=list(eos_token_ids(decoder.target)),
                                   pad_token_id=eos_token_ids(decoder.target)[0])
        out[prompt] = (ids, generated[0, len(ids):].tolist())
    return out


@pytest.mark.parametrize("drafter", ["draft-model", "ngram"])
def test_real_pair_greedy_identical_to_plain_decoding(decoder, references, drafter, record_property):
    merged = []
    for prompt in PROMPTS:
        ids, expected = references[prompt]
        spec = SpecConfig(drafter=drafter, k=5, adaptive=False, target_format="dense")
        result = decoder.generate(prompt, SamplingParams(max_new_tokens=MAX_NEW), spec=spec)
        merged.append(result.stats)
        assert result.prompt_ids == ids
        if result.token_ids != expected:
            divergence = check_identity(decoder.target.model, ids, expected, result.token_ids)
            assert divergence is not None, (result.token_ids, expected)
            print(f"[{drafter}] {prompt[:40]!r}: {divergence.describe()}")
            assert divergence.numerical, divergence.describe()
    from specwise.stats import SpecStats
    total = SpecStats.combine(merged)
    record_property("tau", total.acceptance_length)
    print(f"[{drafter}] tau = {total.acceptance_length:.2f}, alpha = {total.acceptance_rate:.2f}")
    if drafter == "draft-model":
        assert total.acceptance_length > 2.0  # the 0.5B drafter agrees with its 1.5B target most of the time


@pytest.mark.parametrize("spec", [SpecConfig(drafter="ngram", k=4, adaptive=False, target_format="gguf"),
                                  SpecConfig(drafter="draft-model", k=4, adaptive=False, draft_quantize="gguf",
                                             target_format="gguf"),
                                  SpecConfig(drafter="draft-model", tree_nodes=8, tree_depth=4, tree_branching=2,
                                             draft_quantize="gguf", target_format="gguf"),
                                  SpecConfig(drafter="recycle", k=4, adaptive=False, recycle_with="none",
                                             target_format="gguf"),
                                  SpecConfig(drafter="recycle", tree_nodes=8, tree_depth=4, tree_branching=2,
                                             target_format="gguf")],
                         ids=["ngram", "draft-model", "tree", "recycle", "recycle-tree"])
def test_gguf_target_speculation_equals_its_plain_decoding_exactly(decoder, spec):
    sampling = SamplingParams(max_new_tokens=MAX_NEW)
    plain_spec = SpecConfig(drafter="none", target_format="gguf")
    accepted = 0
    for prompt in PROMPTS:
        plain = decoder.generate(prompt, sampling, spec=plain_spec).token_ids
        fast = decoder.generate(prompt, sampling, spec=spec)
        assert fast.token_ids == plain, prompt
        accepted += fast.stats.accepted
    assert accepted > 0


@pytest.fixture(scope="module")
def gguf_decoder():
    """The default target's GGUF blocks as stored, with SmolLM2-135M (another tokenizer) as draft model."""
    _require(DEFAULT_TARGET)
    _require("smollm2-135m")
    torch.set_num_threads(os.cpu_count() or 1)
    yield SpecDecoder(DEFAULT_TARGET, SpecConfig(drafter="none", target_format="gguf"), drafter_model="smollm2-135m")
    torch.set_num_threads(1)


def test_drafter_with_another_tokenizer_drafts_and_greedy_output_is_the_targets(gguf_decoder, record_property):
    """SmolLM2 drafts for Qwen2.5 through text: speculative output equals the target's plain decoding
    exactly (GGUF blocks keep rows independent), and a fair share of its drafts is accepted."""
    from specwise.drafters.cross_vocab_drafter import CrossVocabDrafter
    from specwise.stats import SpecStats

    spec = SpecConfig(drafter="draft-model", k=5, adaptive=False, target_format="gguf")
    assert isinstance(gguf_decoder.drafter_for(spec), CrossVocabDrafter)
    sampling = SamplingParams(max_new_tokens=MAX_NEW)
    merged = []
    for prompt in PROMPTS:
        plain = gguf_decoder.generate(prompt, sampling).token_ids
        fast = gguf_decoder.generate(prompt, sampling, spec=spec)
        assert fast.token_ids == plain, prompt
        merged.append(fast.stats)
        print(f"[smollm2 -> qwen] {prompt[:40]!r}: alpha = {fast.stats.acceptance_rate:.2f}, "
              f"tau = {fast.stats.acceptance_length:.2f}")
    total = SpecStats.combine(merged)
    record_property("alpha", total.acceptance_rate)
    assert total.acceptance_rate > 0.2, f"alpha = {total.acceptance_rate:.2f}: drafts through text hardly land"


def test_drafter_with_another_tokenizer_samples_through_the_shared_tokens(gguf_decoder):
    spec = SpecConfig(drafter="draft-model", k=4, target_format="gguf")
    result = gguf_decoder.generate(PROMPTS[0], SamplingParams(max_new_tokens=32, temperature=0.7, top_p=0.9, seed=1),
                                   spec=spec)
    assert result.stats.proposed > 0 and result.stats.accepted > 0


def test_drafter_with_another_tokenizer_is_refused_trees(gguf_decoder):
    """Trees are refused by the engine: the drafter has no propose_tree."""
    spec = SpecConfig(drafter="draft-model", tree_nodes=8, tree_depth=4, tree_branching=2, target_format="gguf")
    with pytest.raises(ValueError, match="cannot propose trees.*with the target's tokenizer"):
        gguf_decoder.generate(PROMPTS[1], SamplingParams(max_new_tokens=4), spec=spec)


# --------------------------------------------------------------------------- the files alone


def _require_gguf(name):
    """The verified GGUF file of a known model (assembled from its packages when not in the cache)."""
    from specwise.store.prepare import gguf_file

    try:
        return gguf_file(name, progress=False)
    except ModelError as error:
        if os.environ.get("SPECWISE_REQUIRE_REAL_MODELS") == "1":
            pytest.fail(f"real models required here but not ready: {error}")
        pytest.skip(str(error))


@pytest.mark.parametrize("name", [DEFAULT_TARGET, "smollm2-135m", "gemma3-270m"])
def test_the_config_from_the_metadata_equals_transformers_own(name):
    from transformers import AutoConfig

    from specwise.gguf.config import gguf_config

    path = _require_gguf(name)
    names = ("_name_or_path", "_model_name_or_path")
    ours = {k: v for k, v in gguf_config(path).to_dict().items() if k not in names}
    theirs = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    assert ours == {k: v for k, v in theirs.items() if k not in names}


@pytest.mark.parametrize("name", [DEFAULT_TARGET, "smollm2-135m", "gemma3-270m"])
def test_the_tokenizer_from_the_file_tokenizes_as_transformers_own_and_the_dense_copy(name):
    from transformers import AutoTokenizer

    from specwise.gguf.tokenizer import gguf_tokenizer

    path = _require_gguf(name)
    ours = gguf_tokenizer(path)
    references = [AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)]  # transformers' own build
    if name == DEFAULT_TARGET:
        _require(name)
        references.append(AutoTokenizer.from_pretrained(resolve_model(name)))  # the dense copy's
    messages = [{"role": "system", "content": "You answer in one line."}, {"role": "user", "content": PROMPTS[0]}]
    texts = PROMPTS + ["def f(x):\n\treturn x  # ünïcödé, 日本語, 🙂", "<|im_start|>user\nhi<|im_end|>\n", "   "]
    for reference in references:
        assert ours.get_vocab() == reference.get_vocab()
        assert (ours.eos_token, ours.bos_token, ours.chat_template) == (reference.eos_token, reference.bos_token,
                                                                         reference.chat_template)
        for text in texts:
            ids = ours(text).input_ids
            assert ids == reference(text).input_ids and ours.decode(ids) == reference.decode(ids), text
        for prompt in (False, True) if reference.chat_template else ():
            assert (ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
                    == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt))
    assert (ours.chat_template is not None) == (name != "gemma3-270m")


def test_the_default_target_loads_from_its_file_alone(tmp_path, monkeypatch):
    """In an empty cache home, the gguf format loads the real file with nothing converted: no
    safetensors written, only the tokenizer kept."""
    from specwise.store import loading

    path = _require_gguf(DEFAULT_TARGET)
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    monkeypatch.setattr(loading, "_TOKENIZERS", {})  # read in this process already, from the usual home
    loaded = loading.load_model(str(path), format="gguf")
    assert loaded.model.config.model_type == "qwen2" and loaded.tokenizer.eos_token == "<|im_end|>"
    assert loaded.tokenizer.chat_template and not list(tmp_path.rglob("*.safetensors"))
    assert {p.name for p in tmp_path.iterdir()} == {"tokenizers"}


def _runner_logits(runner, ids):
    runner.reset()
    return runner.forward(list(ids)).float()


def test_gemma3_runs_as_stored_as_transformers_runs_the_same_modules():
    """The real Gemma 3 270M file in the gguf format (q/k norms, sandwich norms, GeGLU, sliding windows,
    local and global rotary tables): the lean runner and transformers' Gemma 3 model built over the same
    modules (`hf_model()`) are the same model up to rounding (their logits over prompt and output no
    further apart than 1.5 times what one input rounding moves transformers' own, numerics.
    rounding_sensitivity; the negative control, the final norm 10 % off, is 2.5-3 times as far); their
    greedy tokens are equal or first differ where both tokens lie within the two's difference of the top;
    speculative output equals the runner's own plain decoding exactly.

    Why not check_identity's float32 grid: the two add in other orders, and Gemma's int8 activations carry
    one rounding through every layer (one unit in the last place of the input embeddings moves this model's
    logits by 0.2-0.3 rms and up to about one logit, of a range of ~40)."""
    from specwise.gguf.model import GGUFCausalLM
    from specwise.runners.lean import LeanRunner
    from specwise.numerics import rms_difference, rounding_sensitivity, sequence_logits

    _require_gguf("gemma3-270m")
    decoder = SpecDecoder("gemma3-270m", SpecConfig(drafter="none"))
    model = decoder.target.model
    assert isinstance(model, GGUFCausalLM) and model.config.model_type == "gemma3_text"
    sampling = SamplingParams(max_new_tokens=20, ignore_eos=True)
    hf = model.hf_model()
    runner = LeanRunner(model)
    for prompt in PROMPTS[1:]:
        plain = decoder.generate(prompt, sampling)
        ids = plain.prompt_ids
        sequence = ids + plain.token_ids
        ours, theirs = _runner_logits(runner, sequence), sequence_logits(hf, sequence)
        drift, floor = rms_difference(ours, theirs), rounding_sensitivity(hf, sequence)
        print(f"[gemma3] {prompt[:40]!r}: runner - transformers {drift:.3f} rms, one input rounding {floor:.3f}")
        assert drift <= 1.5 * floor, (drift, floor)
        with torch.inference_mode():
            generated = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=20, min_new_tokens=20, do_sample=False)
        expected = generated[0, len(ids):].tolist()
        if plain.token_ids != expected:
            divergence = check_identity(hf, ids, expected, plain.token_ids)
            print(f"[gemma3] {prompt[:40]!r}: {divergence.describe()}")
            j = divergence.position
            row = len(ids) + j - 1  # the logits for new token j, after the common prefix
            apart = float((ours[row] - theirs[row]).abs().max())
            assert max(divergence.reference_gap, divergence.method_gap) <= apart, (divergence.describe(), apart)
        fast = decoder.generate(prompt, sampling, spec=SpecConfig(drafter="ngram", k=4))
        assert fast.token_ids == plain.token_ids, prompt
    # Negative control, on the last prompt's sequence (its `ours` and `floor`): transformers' model with its
    # final norm 10 % off is not the runner's model.
    norm = hf.model.norm
    saved = norm.weight
    try:
        norm.weight = torch.nn.Parameter(saved * 1.1, requires_grad=False)
        wrong = rms_difference(ours, sequence_logits(hf, sequence))
    finally:
        norm.weight = saved
    assert wrong > 1.5 * floor, (wrong, floor)
