"""The EAGLE drafter: features, the head, training, losslessness, files bound to their target.

Tiny random Qwen2 targets in float32 (4 layers, features from layers 0, 1, 2); one short
training run on generated text is shared by the tests that want a trained head.
"""

import math
import random
import statistics

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpecDecoder, SpeculativeEngine
from specwise.eagle import (EagleDrafter, EagleHead, HeadCache, MissingFeaturesError, TargetMismatchError,
                            config_for_target, load_head, read_head, save_head, target_fingerprint)
from specwise.eagle.commands import DataOptions, train_drafter
from specwise.eagle.data import FeatureData, draft_vocabulary, record_chunks
from specwise.eagle.train import TrainOptions, evaluate
from specwise.runners.lean import LeanRunner
from specwise.runners.hf import HFRunner
from specwise.testing import tiny_config, tiny_loaded, tiny_tokenizer

from helpers import ALPHA, LENGTH, PROMPT, SAMPLES, SAMPLING, exact_distribution, hf_greedy, p_value

LAYERS = (0, 1, 2)
VOCAB = tiny_config().vocab_size
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "it", "is", "red", "big", "fox"]


def make_target(seed=0):
    return tiny_loaded(seed=seed, layers=4)


def make_head(model, draft_vocab=None, seed=0, vocab_ids=None):
    torch.manual_seed(seed)
    config = config_for_target(model, draft_vocab_size=draft_vocab, intermediate_size=64, feature_layers=LAYERS)
    if vocab_ids is None and draft_vocab is not None:
        order = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))
        vocab_ids = order[:draft_vocab].sort().values  # a reduced vocabulary
    head = EagleHead(config, vocab_ids)
    head.init_from_target(model.get_output_embeddings().weight)
    return head.eval()


def corpus_text(seed=0, sentences=220):
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))).capitalize() + "." for _ in range(sentences)]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def target():
    return make_target()


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    """One short training run through the whole pipeline (recording, vocabulary, training, saving)."""
    root = tmp_path_factory.mktemp("eagle")
    corpus = root / "corpus.txt"
    corpus.write_text(corpus_text())
    out = root / "run"
    data = DataOptions(corpus=(str(corpus),), chunk_tokens=48, max_tokens=48 * 40, top_k=16, heldout_every=8,
                       draft_vocab=60, intermediate_size=64, runner="hf")
    options = TrainOptions(max_steps=150, batch_size=4, lr=3e-3, warmup=10, eval_every=75, checkpoint_every=75,
                           ttt_steps=3, seed=0)
    report = train_drafter(target, out, data, options, progress=False)
    return {"out": out, "report": report, "corpus": corpus_text()}


# -- features --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [HFRunner, LeanRunner])
def test_runner_hidden_states_equal_hugging_face(target, kind):
    ids = [5, 9, 14, 20, 33, 7, 8]
    with torch.no_grad():
        reference = target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    runner = kind(target.model)
    runner.reset()
    plain = runner.forward(ids[:4])
    assert runner.last_hidden is None  # nothing recorded unless asked
    runner.reset()
    logits = runner.forward(ids[:4], hidden_layers=LAYERS)
    torch.testing.assert_close(logits, plain)  # asking for features changes nothing else
    first = runner.last_hidden
    runner.forward(ids[4:], hidden_layers=[2, 0])
    second = runner.last_hidden
    assert first.shape == (4, 3, 32) and second.shape == (3, 2, 32)
    for column, layer in enumerate(LAYERS):
        torch.testing.assert_close(first[:, column], reference[layer + 1][0, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second[:, 0], reference[3][0, 4:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second[:, 1], reference[1][0, 4:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="hidden_layers"):
        runner.forward([3], hidden_layers=[4])


def test_tree_pass_records_one_row_per_node(target):
    runner = LeanRunner(target.model)
    runner.reset()
    runner.forward([5, 9, 14])
    runner.forward_tree([20, 21, 22], [-1, 0, -1], hidden_layers=LAYERS)
    tree_hidden = runner.last_hidden
    runner.rollback(3)
    runner.forward([20, 21], hidden_layers=LAYERS)  # the path 20 -> 21 as a chain
    torch.testing.assert_close(tree_hidden[:2], runner.last_hidden, atol=1e-5, rtol=1e-5)


# -- the head --------------------------------------------------------------------------------


def test_head_shapes_and_feature_fusion(target):
    head = make_head(target.model, draft_vocab=30)
    assert head.config.feature_layers == LAYERS and head.config.target_vocab_size == VOCAB
    hidden = torch.randn(2, 5, 3, 32)
    fused = head.fuse(hidden)
    assert fused.shape == (2, 5, 32)
    torch.testing.assert_close(fused, hidden.reshape(2, 5, 96) @ head.fc.weight.T)  # concat low|mid|high
    logits = head.forward_unrolled(torch.randn(2, 5, 32), hidden, steps=3)
    assert [tuple(x.shape) for x in logits] == [(2, 5, 30)] * 3
    inverse = head.target_to_draft()
    assert inverse.shape == (VOCAB,) and (inverse[head.draft_to_target] == torch.arange(30)).all()
    assert int((inverse >= 0).sum()) == 30


def test_unrolled_training_steps_equal_cached_drafting(target):
    """Training-time test step j computes exactly what the drafter computes for its (j+1)-th token."""
    head = make_head(target.model)
    torch.manual_seed(1)
    length = 9
    embeds, hidden = torch.randn(1, length, 32), torch.randn(1, length, 3, 32)
    with torch.no_grad():
        unrolled = head.forward_unrolled(embeds, hidden, steps=3)
        for end in range(0, length - 2):  # context positions 0..end from the target, then 2 draft steps
            cache = HeadCache(head.config, torch.float32)
            logits, state = head.forward_cached(embeds[0, :end + 1], head.fuse(hidden[0, :end + 1]),
                                                torch.arange(end + 1), cache)
            torch.testing.assert_close(logits[-1], unrolled[0][0, end], atol=1e-5, rtol=1e-5)
            state = state[-1:]
            for step in (1, 2):
                logits, state = head.forward_cached(embeds[0, end + step:end + step + 1], state,
                                                    torch.tensor([end + step]), cache)
                torch.testing.assert_close(logits[0], unrolled[step][0, end + step], atol=1e-5, rtol=1e-5)


def test_default_corpus_is_the_standard_library_sources(tmp_path):
    from specwise.eagle.data import corpus_files, iter_chunks, stdlib_files

    files = stdlib_files()
    names = {f"{p.parent.name}/{p.name}" for p in files}
    assert "json/decoder.py" in names and all(p.suffix == ".py" for p in files)
    assert not any("site-packages" in p.parts or "test" in p.parts for p in files)
    assert corpus_files(None) == files
    (tmp_path / "a.txt").write_text("abc " * 40)
    (tmp_path / "skip.bin").write_bytes(b"x")
    assert corpus_files([tmp_path]) == [tmp_path / "a.txt"]
    chunks = list(iter_chunks(tiny_tokenizer(), corpus_files([tmp_path]), 32))
    assert len(chunks) == 5 and all(len(c) == 32 for c in chunks)
    with pytest.raises(FileNotFoundError):
        corpus_files([tmp_path / "missing"])


def test_draft_vocabulary_prefers_frequent_tokens():
    tokens = torch.tensor([[3, 3, 3, 5, 5, 7]])
    data = FeatureData(tokens, torch.zeros(1, 6, 3, 2), torch.full((1, 6, 1), 9, dtype=torch.int32),
                       torch.ones(1, 6, 1, dtype=torch.float16), torch.tensor([0]))
    assert draft_vocabulary(data, 12, 3).tolist() == [3, 5, 9]
    assert draft_vocabulary(data, 12, 12).tolist() == list(range(12))


# -- the drafter -----------------------------------------------------------------------------


def engine(target, head, spec=None, runner=HFRunner, eos=(0,)):
    drafter = EagleDrafter(head, target.model.get_input_embeddings().weight, VOCAB)
    return SpeculativeEngine(runner(target.model), drafter, spec or SpecConfig(k=4, adaptive=False), eos_token_ids=eos)


def test_sampled_draft_probs_are_the_draft_vocabulary_distribution(target):
    head = make_head(target.model, draft_vocab=30)
    run = engine(target, head)
    drafter = run.drafter
    sampling = SamplingParams(temperature=1.0, top_k=10, max_new_tokens=8, seed=0)
    prompt = [5, 9, 14, 20, 33]
    run.target.reset()
    run.target.forward(prompt[:-1], hidden_layers=LAYERS)
    drafter.start(prompt, sampling, torch.Generator().manual_seed(0))
    drafter.add_features(0, run.target.last_hidden)
    proposal = drafter.propose(prompt, 4)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[head.draft_to_target] = False
    assert proposal.probs.shape == (4, VOCAB)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(4))
    assert (proposal.probs[:, outside] == 0).all()
    assert all(proposal.probs[i, t] > 0 for i, t in enumerate(proposal.tokens.tolist()))
    assert ((proposal.probs > 0).sum(-1) <= 10).all()  # top-k applied to what was sampled from
    tree = drafter.propose_tree(prompt, 6, 3, 2)
    torch.testing.assert_close(tree.probs.sum(-1), torch.ones(len(tree)))
    assert (tree.probs[:, outside] == 0).all()


def test_tree_top_path_equals_the_chain(target):
    # Greedy: following each node's first (top) child must give the chain's tokens; a node that
    # saw its siblings or cousins through a wrong tree mask would drift from it.
    head = make_head(target.model, draft_vocab=50)
    with torch.no_grad():  # sharpen attention and let it dominate, so that what a node sees decides its argmax
        head.qkv.weight.mul_(8.0)
        head.o_proj.weight.mul_(8.0)
    run = engine(target, head)
    drafter = run.drafter
    prompt = [5, 9, 14, 20, 33]
    run.target.reset()
    run.target.forward(prompt[:-1], hidden_layers=LAYERS)
    drafter.start(prompt, SamplingParams(), torch.Generator().manual_seed(0))
    drafter.add_features(0, run.target.last_hidden)
    chain = drafter.propose(prompt, 4).tokens.tolist()
    tree = drafter.propose_tree(prompt, 16, 4, 2)
    parents = tree.parents.tolist()
    path, node = [], -1
    for _ in range(4):
        node = parents.index(node)  # the first child listed is the top one
        path.append(int(tree.tokens[node]))
    assert path == chain
    assert len(tree) > 4 and max(parents.count(p) for p in set(parents)) == 2


def test_drafting_without_features_is_refused(target):
    drafter = EagleDrafter(make_head(target.model), target.model.get_input_embeddings().weight, VOCAB)
    drafter.start([5, 9, 14], SamplingParams(), torch.Generator())
    with pytest.raises(MissingFeaturesError, match="add_features"):
        drafter.propose([5, 9, 14], 3)


PROMPTS = [[5, 9, 14, 20, 33], [40, 41, 42, 40, 41, 42, 40, 41], [7]]


@pytest.mark.parametrize("runner", [HFRunner, LeanRunner])
def test_greedy_identity_untrained_head(target, runner):
    head = make_head(target.model, draft_vocab=50)
    for prompt in PROMPTS:
        expected = hf_greedy(target.model, prompt, 30)
        for spec in (SpecConfig(k=4), SpecConfig(tree_nodes=8, tree_depth=3, tree_branching=3)):
            result = engine(target, head, spec, runner).generate(prompt, SamplingParams(max_new_tokens=30))
            assert result.token_ids == expected, (prompt, spec)


def test_training_lowers_loss_and_raises_acceptance(target, trained):
    report = trained["report"]
    history = report.history
    assert history.steps[-1] == 150
    # The training loss falls far beyond the noise between batches, measured in the same run: the mean of the
    # last ten steps is more than eight standard errors (of the difference of the two means) below that of the
    # first ten. A fixed share of the first loss would depend on where the loss starts and where it floors
    # (the target's own entropy), not on whether training works.
    first, last = history.losses[:10], history.losses[-10:]
    noise = math.sqrt(statistics.variance(first) / len(first) + statistics.variance(last) / len(last))
    assert statistics.mean(first) - statistics.mean(last) > 8 * noise, (first, last)
    assert history.eval_steps[0] == 0 and history.eval_losses[-1] < history.eval_losses[0]  # held out too
    # On its own training text, before and after: the first head is the same init, untrained.
    tokenizer = tiny_tokenizer()
    ids = tokenizer(trained["corpus"], add_special_tokens=False)["input_ids"]
    chunks = [ids[i:i + 48] for i in range(0, 48 * 12, 48)]
    data = record_chunks(HFRunner(target.model), chunks, LAYERS, 16)
    head, info = read_head(trained["out"])
    untrained = EagleHead(head.config, head.draft_to_target)
    untrained.init_from_target(target.model.get_output_embeddings().weight)
    embeddings = target.model.get_input_embeddings().weight
    before = evaluate(untrained, data, embeddings, steps=3)
    after = evaluate(head, data, embeddings, steps=3)
    assert after.loss < before.loss
    assert after.acceptance[0] > before.acceptance[0] + 0.1, (before, after)
    assert after.acceptance_length > before.acceptance_length
    assert (trained["out"] / "loss.png").stat().st_size > 0 and (trained["out"] / "acceptance.png").exists()
    assert info.target_fingerprint == target_fingerprint(target.model)


def test_training_resumes_from_its_checkpoint(target, trained, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(trained["out"], out)
    data = DataOptions(corpus=(str(tmp_path / "unused.txt"),), chunk_tokens=48, max_tokens=48 * 40,
                       draft_vocab=60, intermediate_size=64, runner="hf")
    (tmp_path / "unused.txt").write_text(trained["corpus"])
    options = TrainOptions(max_steps=5, batch_size=4, lr=3e-3, eval_every=1000, checkpoint_every=1000, seed=0)
    with pytest.raises(ValueError, match="--resume"):
        train_drafter(target, out, data, options, progress=False)
    report = train_drafter(target, out, data, options, resume=True, progress=False)
    assert report.history.steps[-1] == 155 and len(report.history.losses) == 155


def test_trained_head_is_lossless_and_accepted_in_the_engine(target, trained):
    head = load_head(trained["out"], target.model, target.name)
    ids = tiny_tokenizer()(trained["corpus"][:60], add_special_tokens=False)["input_ids"]
    accepted = 0
    for runner in (HFRunner, LeanRunner):
        for spec in (SpecConfig(k=3, adaptive=False), SpecConfig(tree_nodes=6, tree_depth=3, tree_branching=2)):
            result = engine(target, head, spec, runner).generate(ids, SamplingParams(max_new_tokens=40,
                                                                                    ignore_eos=True))
            assert result.token_ids == hf_greedy(target.model, ids, 40, eos=False)
            accepted += result.stats.accepted
    assert accepted > 0


def test_plain_drafters_get_plain_target_passes(target):
    from specwise.drafters import NgramDrafter

    class PlainRunner(HFRunner):  # a runner that knows nothing of hidden states
        def forward(self, ids, *, logits=True):
            return super().forward(ids, logits=logits)

    runner = PlainRunner(target.model)
    result = SpeculativeEngine(runner, NgramDrafter(1, 3), SpecConfig(k=3)).generate(
        PROMPTS[1], SamplingParams(max_new_tokens=10))
    assert result.token_ids == hf_greedy(target.model, PROMPTS[1], 10)
    assert runner.last_hidden is None
    drafter = EagleDrafter(make_head(target.model), target.model.get_input_embeddings().weight, VOCAB)
    del runner.last_hidden  # now it cannot record them either
    with pytest.raises(ValueError, match="cannot record"):
        SpeculativeEngine(runner, drafter, SpecConfig(k=3))


# -- files -----------------------------------------------------------------------------------


def test_save_load_round_trip_and_refusal_of_another_target(target, tmp_path):
    head = make_head(target.model, draft_vocab=30)
    path = save_head(tmp_path / "head.pt", head, "tiny-0", target_fingerprint(target.model), {"note": 1})
    loaded = load_head(path, target.model, "tiny-0")
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert loaded.config == head.config and read_head(path)[1].metadata == {"note": 1}
    # The same weights in bfloat16 are the same target.
    assert target_fingerprint(make_target().model.to(torch.bfloat16)) == target_fingerprint(target.model)
    other = make_target(seed=1)
    with pytest.raises(TargetMismatchError, match=r"'tiny-0'.*'tiny-1'"):
        load_head(path, other.model, other.name)
    with pytest.raises(TargetMismatchError):
        SpecDecoder(other, SpecConfig(drafter="eagle", runner="hf", drafter_options={"head": str(path)}))


def test_registered_drafter_through_the_api(target, trained):
    spec = SpecConfig(drafter="eagle", runner="lean", k=3, drafter_options={"head": str(trained["out"])})
    decoder = SpecDecoder(target, spec)
    result = decoder.generate([5, 9, 14, 20], SamplingParams(max_new_tokens=20))
    assert result.token_ids == hf_greedy(target.model, [5, 9, 14, 20], 20)
    with pytest.raises(ValueError, match="head=PATH"):
        SpecDecoder(target, SpecConfig(drafter="eagle"))


def test_a_head_in_the_default_place_needs_no_option(target, trained, tmp_path, monkeypatch):
    import shutil

    from specwise.eagle.io import default_head_dir

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    with pytest.raises(ValueError, match=r"specwise train-drafter --target tiny-0 --minutes"):
        SpecDecoder(target, SpecConfig(drafter="eagle"))
    place = default_head_dir(target.name)
    assert place == tmp_path / "heads" / "tiny-0"
    place.mkdir(parents=True)
    shutil.copy(trained["out"] / "head.pt", place / "head.pt")
    decoder = SpecDecoder(target, SpecConfig(drafter="eagle", runner="lean", k=3))
    assert decoder.generate([5, 9, 14, 20], SamplingParams(max_new_tokens=12)).token_ids == \
        hf_greedy(target.model, [5, 9, 14, 20], 12)


def test_cli_trains_and_generates(tmp_path, capsys):
    from specwise.cli import main

    model = make_target()
    model_dir = tmp_path / "tiny"
    model.model.save_pretrained(model_dir)
    model.tokenizer.save_pretrained(model_dir)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(sentences=40))
    out = tmp_path / "run"
    assert main(["train-drafter", "--target", str(model_dir), "--corpus", str(corpus), "--out", str(out),
                 "--max-steps", "3", "--dtype", "float32", "--runner", "hf", "--chunk-tokens", "32",
                 "--draft-vocab", "50", "--intermediate-size", "32", "--no-progress", "--threads", "1"]) == 0
    assert (out / "head.pt").exists() and "head:" in capsys.readouterr().out
    assert main(["generate", "--target", str(model_dir), "--raw", "--dtype", "float32", "--drafter", "eagle",
                 "--drafter-option", f"head={out}", "--max-new-tokens", "8", "--json", "--threads", "1",
                 "The cat"]) == 0
    assert '"drafter": "eagle"' in capsys.readouterr().out


# -- the statistical test at temperature 1 (tests/helpers.py) ----------------------------------


@pytest.fixture(scope="module")
def distilled_head(target):
    """A head trained on the target's own samples after the statistical test's prompt, so that
    its drafts there are accepted most of the time and the check covers every verifier branch."""
    from specwise.eagle.train import train_head

    torch.manual_seed(0)
    with torch.no_grad():
        samples = target.model.generate(
            torch.tensor([PROMPT] * 96), do_sample=True, top_k=SAMPLING.top_k, top_p=SAMPLING.top_p,
            max_new_tokens=6, eos_token_id=None, pad_token_id=0,
            attention_mask=torch.ones(96, len(PROMPT), dtype=torch.long))
    data = record_chunks(HFRunner(target.model), samples.tolist(), LAYERS, 16)
    head = make_head(target.model, draft_vocab=60, vocab_ids=torch.arange(60))  # a reduced vocabulary
    train_head(head, data, None, target.model.get_input_embeddings().weight,
               TrainOptions(max_steps=300, batch_size=8, lr=3e-3, warmup=10, ttt_steps=2, seed=0), progress=False)
    return head


@pytest.mark.slow
@pytest.mark.parametrize("verifier, tree", [("block", False), ("token", False), ("token", True)])
def test_engine_output_has_target_distribution(target, distilled_head, verifier, tree):
    exact = exact_distribution(target.model)
    spec = (SpecConfig(verifier=verifier, tree_nodes=4, tree_depth=LENGTH - 1, tree_branching=2) if tree
            else SpecConfig(k=LENGTH - 1, verifier=verifier))
    run = engine(target, distilled_head, spec, eos=())  # always LENGTH tokens, as the enumeration assumes
    counts, accepted, proposed = {}, 0, 0
    for seed in range(SAMPLES):
        result = run.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed}))
        counts[tuple(result.token_ids)] = counts.get(tuple(result.token_ids), 0) + 1
        accepted, proposed = accepted + result.stats.accepted, proposed + result.stats.proposed
    assert accepted > 0.2 * proposed  # drafts are accepted often: the check covers every branch
    p = p_value(counts, exact)
    assert p > ALPHA, f"eagle/{verifier}/tree={tree}: chi-square p = {p:.2e}"


@pytest.mark.slow
def test_misreported_draft_probs_fail_the_same_check(target, distilled_head):
    """Tokens sampled from one distribution but reported as another (flattened) must show up."""
    from specwise.drafters import DraftProposal

    class Misreporting(EagleDrafter):
        def propose(self, context, k):
            proposal = super().propose(context, k)
            if proposal.probs is None:  # nothing proposed
                return proposal
            flat = proposal.probs.sqrt()
            return DraftProposal(proposal.tokens, flat / flat.sum(-1, keepdim=True))

    exact = exact_distribution(target.model)
    drafter = Misreporting(distilled_head, target.model.get_input_embeddings().weight, VOCAB)
    run = SpeculativeEngine(HFRunner(target.model), drafter, SpecConfig(k=LENGTH - 1, verifier="token"))
    counts = {}
    for seed in range(SAMPLES):
        tokens = tuple(run.generate(PROMPT, SamplingParams(**{**SAMPLING.__dict__, "seed": seed})).token_ids)
        counts[tokens] = counts.get(tokens, 0) + 1
    assert p_value(counts, exact) < ALPHA


def test_recording_keeps_its_time_budget_per_chunk(target):
    """A shard holds many chunks; the deadline is checked before each one, not once per shard."""
    import time

    chunks = [[(7 * i + j) % 60 + 4 for j in range(16)] for i in range(5)]
    late = record_chunks(HFRunner(target.model), chunks, LAYERS, 4, first_index=10, deadline=time.monotonic() - 1)
    assert len(late) == 1 and late.index.tolist() == [10]  # at least one chunk, then the budget is spent
    full = record_chunks(HFRunner(target.model), chunks, LAYERS, 4, deadline=time.monotonic() + 600)
    assert len(full) == 5 and torch.equal(full.tokens[0], late.tokens[0])


def test_training_precision_follows_the_hardware(monkeypatch):
    """bfloat16 autocast only where the CPU computes in bfloat16 natively (else it is several times slower)."""
    import specwise.eagle.train as train_module
    from specwise.eagle.commands import _train_bf16

    bf16_target = make_target()
    bf16_target.model.to(torch.bfloat16)
    assert _train_bf16("float32", bf16_target) is False and _train_bf16("bfloat16", make_target()) is True
    monkeypatch.setattr(train_module, "native_bf16", lambda: False)
    assert _train_bf16("auto", bf16_target) is False
    monkeypatch.setattr(train_module, "native_bf16", lambda: True)
    assert _train_bf16("auto", bf16_target) is True and _train_bf16("auto", make_target()) is False
