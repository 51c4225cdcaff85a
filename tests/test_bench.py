"""specwise bench's logic on tiny models: tasks, selection, turns, interleaving, aggregation, mismatches."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

import specwise
from specwise import numerics
from specwise.api import SpecDecoder
from specwise.bench import methods as bm
from specwise.bench.harness import BenchSettings, Harness, rotated
from specwise.bench.methods import BenchModels, MethodOutput, build_method
from specwise.numerics import FAILURE, NUMERICAL, check_identity, classify, first_divergence
from specwise.bench.prompts import (DEFAULT_QUESTIONS, MT_BENCH, MT_BENCH_CATEGORIES, TASKS, Question,
                                    conversation, load_questions, normalize_task, select_questions, task_of)
from specwise.bench.report import OVERALL, aggregate, summary_markdown, task_mean_speedup
from specwise.config import SamplingParams, SpecConfig
from specwise.testing import tiny_loaded

GREEDY8 = SamplingParams(max_new_tokens=8)


@pytest.fixture(scope="module")
def models() -> BenchModels:
    target, drafter = tiny_loaded(0), tiny_loaded(1)
    decoder = SpecDecoder(target, SpecConfig(drafter="none"), drafter_model=drafter, dtype=torch.float32)
    return BenchModels(decoder, drafter)


def q(question_id, category, *turns) -> Question:
    return Question(question_id, category, tuple(turns) or ("Say hi.",))


# --------------------------------------------------------------------------- prompts and tasks


def test_category_to_task_mapping():
    for category in MT_BENCH_CATEGORIES:
        assert task_of(category) == MT_BENCH
    for task in ("translation", "summarization", "qa", "math_reasoning", "rag"):
        assert task_of(task) == task
    assert task_of("my-own-category") == "my-own-category"  # other files: each category its own task
    assert normalize_task("mt-bench") == normalize_task("Multi-Turn Conversation") == MT_BENCH
    assert normalize_task("math-reasoning") == "math_reasoning"
    assert normalize_task("QA") == "qa"


def test_select_n_per_task_spreads_mt_bench_over_categories():
    questions = [q(i, cat) for i, cat in enumerate(["writing"] * 3 + ["math"] * 3 + ["coding"] * 3 + ["qa"] * 5)]
    picked = select_questions(questions, per_task=4)
    mt = [x for x in picked if x.task == MT_BENCH]
    assert [x.category for x in mt] == ["writing", "math", "coding", "writing"]  # round robin, file order
    assert [x.question_id for x in picked if x.task == "qa"] == [9, 10, 11, 12]
    assert [x.task for x in picked] == [MT_BENCH] * 4 + ["qa"] * 4  # Spec-Bench's task order
    only_qa = select_questions(questions, tasks=["qa"], per_task=2)
    assert [x.question_id for x in only_qa] == [9, 10]
    assert [x.category for x in select_questions(questions, categories=["math"])] == ["math"] * 3
    with pytest.raises(ValueError, match="no questions for task"):
        select_questions(questions, tasks=["rag"])


def test_default_questions_ship_with_the_package():
    assert DEFAULT_QUESTIONS.is_file() and DEFAULT_QUESTIONS.is_relative_to(Path(specwise.__file__).parent)
    questions = load_questions(DEFAULT_QUESTIONS)
    assert len(questions) == 240 and len({x.question_id for x in questions}) == 240
    per_task = {task: sum(x.task == task for x in questions) for task in TASKS}
    assert per_task == {MT_BENCH: 40, "translation": 40, "summarization": 40, "qa": 40, "math_reasoning": 40,
                        "rag": 40}
    assert {x.category for x in questions if x.task == MT_BENCH} == set(MT_BENCH_CATEGORIES)


def test_default_file_has_spec_bench_tasks():
    picked = select_questions(load_questions(DEFAULT_QUESTIONS), per_task=5)
    assert {x.task for x in picked} == set(TASKS)
    assert all(sum(x.task == t for x in picked) == 5 for t in TASKS)
    assert len({x.category for x in picked if x.task == MT_BENCH}) == 5


def test_load_questions_names_bad_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["a"]}) + "\n{\"turns\": []}\n")
    with pytest.raises(ValueError, match=r"q\.jsonl:2"):
        load_questions(path)


def test_conversation_builds_turns_with_own_answers():
    question = q(1, "writing", "first?", "second?")
    assert conversation(question, 0, [], chat=True) == [{"role": "user", "content": "first?"}]
    assert conversation(question, 1, ["answer one"], chat=True) == [
        {"role": "user", "content": "first?"}, {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "second?"}]
    assert conversation(question, 1, ["answer one"], chat=False) == "first?\n\nanswer one\n\nsecond?"
    with pytest.raises(ValueError):
        conversation(question, 1, [], chat=True)


# --------------------------------------------------------------------------- methods


def test_specwise_method_syntax_and_labels():
    base = SpecConfig(adaptive=False)  # fixed-k labels
    spec, model, label = bm.parse_specwise_method("specwise:drafter=ngram,k=8,ngram_max=3", base)
    assert (spec.drafter, spec.k, spec.ngram_max, model, label) == ("ngram", 8, 3, None, None)
    assert bm.spec_label(spec, model, base) == "specwise-ngram-k8-n1-3"
    spec, _, _ = bm.parse_specwise_method("specwise:drafter=draft-model,adaptive=1,k_max=10,verifier=block", base)
    assert bm.spec_label(spec) == "specwise-draft-model-adaptive1-10-block"
    spec, _, _ = bm.parse_specwise_method("specwise:drafter=draft-model,k=5", base)
    assert bm.spec_label(spec) == "specwise-draft-model-k5"
    spec, _, _ = bm.parse_specwise_method("specwise:drafter=draft-model,k=4,quantize=int8", base)
    assert spec.draft_quantize == "int8" and bm.spec_label(spec) == "specwise-draft-model-k4-int8"
    spec, _, _ = bm.parse_specwise_method("specwise:drafter=draft-model,k=4,quantize=int8,vocab=32768", base)
    assert spec.draft_vocab == 32768 and bm.spec_label(spec) == "specwise-draft-model-k4-v32768-int8"
    spec, _, _ = bm.parse_specwise_method("specwise:drafter=eagle,k=3,head=/heads/mine", base)
    assert spec.drafter_options == {"head": "/heads/mine"} and bm.spec_label(spec) == "specwise-eagle-k3"
    spec, _, _ = bm.parse_specwise_method("specwise", SpecConfig(drafter="ngram", k=3, adaptive=False))
    assert bm.spec_label(spec) == "specwise-ngram-k3"  # unset keys come from the command line's values
    for bad in ("specwise:k=x", "specwise:colour=red", "specwise:k", "hf:drafter=x"):
        with pytest.raises(ValueError):
            bm.parse_specwise_method(bad, base)
    names, groups = bm.sweep_k(["hf-generate", "specwise:drafter=ngram"], [1, 4], base)
    assert names == ["hf-generate", "specwise:drafter=ngram,k=1", "specwise:drafter=ngram,k=4"]
    assert groups == {"specwise:drafter=ngram": [(1, "specwise:drafter=ngram,k=1"), (4, "specwise:drafter=ngram,k=4")]}


def test_adaptive_takes_three_values_and_a_run_settles_auto():
    """adaptive=1|0|auto; a method's label says the k policy its run's sampling gives it."""
    base = SpecConfig()
    forms = {"1": True, "on": True, "0": False, "false": False, "auto": "auto", "AUTO": "auto"}
    for text, value in forms.items():
        assert bm.parse_specwise_method(f"specwise:adaptive={text}", base)[0].adaptive == value
    with pytest.raises(ValueError, match=r"adaptive must be true, false or auto \(1/0/auto\); got 'sometimes'"):
        bm.parse_specwise_method("specwise:adaptive=sometimes", base)
    spec, _, _ = bm.parse_specwise_method("specwise", base)
    assert bm.spec_label(spec) == "specwise-ngram-k4-auto1-12"  # unsettled: k 4 or adaptive 1-12
    # --sweep-k fixes an "auto" configuration's k and refuses an adaptive one
    names, _ = bm.sweep_k(["specwise:drafter=ngram"], [2], base)
    assert names == ["specwise:drafter=ngram,k=2,adaptive=0"]
    assert bm.spec_label(bm.parse_specwise_method(names[0], base)[0]) == "specwise-ngram-k2"
    with pytest.raises(ValueError, match="adaptive"):
        bm.sweep_k(["specwise:drafter=ngram,adaptive=1"], [2], base)


def test_a_run_settles_adaptive_auto_for_its_sampling(models):
    def label(sampling, name="specwise"):
        return bm.build_method(name, models, SpecConfig(), sampling=sampling).label

    assert label(SamplingParams()) == "specwise-ngram-adaptive1-12"  # greedy: adaptive k
    assert label(SamplingParams(temperature=0.7)) == "specwise-ngram-adaptive1-12"  # nothing to repeat
    # seeded: coupled verification (auto's rule for the n-gram drafter) repeats the output at any k
    assert label(SamplingParams(temperature=0.7, seed=3)) == "specwise-ngram-adaptive1-12"
    # under token-level rejection sampling only a fixed k repeats it
    assert label(SamplingParams(temperature=0.7, seed=3), "specwise:verifier=token") == "specwise-ngram-k4-token"
    assert label(SamplingParams(), "specwise:adaptive=0") == "specwise-ngram-k4"
    assert label(SamplingParams(temperature=0.7, seed=3), "specwise:adaptive=1") == "specwise-ngram-adaptive1-12"
    assert label(None) == "specwise-ngram-k4-auto1-12"  # each generation settles it


def test_hf_kwargs_override_model_defaults(models):
    greedy = bm.hf_generate_kwargs(SamplingParams(max_new_tokens=5, stop_token_ids=(7,)), (0,))
    assert greedy["do_sample"] is False and greedy["eos_token_id"] == [0, 7] and greedy["max_new_tokens"] == 5
    sampled = bm.hf_generate_kwargs(SamplingParams(temperature=0.7, top_k=0, top_p=0.9), (0,))
    assert (sampled["do_sample"], sampled["temperature"], sampled["top_k"], sampled["top_p"]) == (True, 0.7, 0, 0.9)


# --------------------------------------------------------------------------- harness


class EchoMethod:
    """Answers every prompt with fixed text; remembers the prompts it was given."""

    family = "fake"
    weights = "dense"
    description = "fixed answer"

    def __init__(self, label: str, text: str, tokenizer) -> None:
        self.label, self.tokenizer = label, tokenizer
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [0]
        self.prompts: list[list[int]] = []

    def generate(self, prompt_ids, sampling) -> MethodOutput:
        self.prompts.append(list(prompt_ids))
        return MethodOutput(list(self.ids), 0.01, len(self.ids))


class CorruptMethod:
    """hf-generate with one output token changed: a planted bug the check must catch."""

    family = "fake"
    weights = "dense"
    description = "corrupted"

    def __init__(self, inner, position: int) -> None:
        self.label, self.inner, self.position = "corrupt", inner, position

    def generate(self, prompt_ids, sampling) -> MethodOutput:
        out = self.inner.generate(prompt_ids, sampling)
        tokens = list(out.token_ids)
        if len(tokens) > self.position:
            tokens[self.position] = (tokens[self.position] + 1) % 60 + 4  # a character, never EOS
        return MethodOutput(tokens, out.seconds, out.steps)


def test_second_turn_contains_each_methods_own_first_answer(models):
    tokenizer = models.decoder.tokenizer
    alpha, beta = EchoMethod("alpha", "apples", tokenizer), EchoMethod("beta", "bananas", tokenizer)
    question = q(7, "writing", "Name a fruit.", "Why that one?")
    records = Harness(models.decoder, [alpha, beta], BenchSettings(GREEDY8, warmup_tokens=0, progress=False,
                                                                   reference="alpha")).run([question])
    assert [(r["turn"], r["method"]) for r in records] == [(1, "alpha"), (1, "beta"), (2, "alpha"), (2, "beta")]
    second_alpha, second_beta = (tokenizer.decode(m.prompts[1]) for m in (alpha, beta))
    assert "apples" in second_alpha and "bananas" not in second_alpha
    assert "bananas" in second_beta and "apples" not in second_beta
    assert second_alpha.index("Name a fruit.") < second_alpha.index("apples") < second_alpha.index("Why that one?")
    expected = models.decoder.encode(conversation(question, 1, ["apples"], chat=True))
    assert alpha.prompts[1] == expected
    assert records[3]["check"].startswith("skipped")  # beta's turn-2 prompt differs from the reference's


def test_each_model_is_checked_against_its_own_reference(models):
    """Methods on the GGUF blocks are held to that model's plain decoding, not to the dense reference."""
    from types import SimpleNamespace

    tokenizer = models.decoder.tokenizer
    dense_ref, dense = EchoMethod("hf-generate", "apples", tokenizer), EchoMethod("dense", "apples", tokenizer)
    gguf_first, gguf_plain = EchoMethod("q-fast", "pears", tokenizer), EchoMethod("q-plain", "pears", tokenizer)
    gguf_first.weights = gguf_plain.weights = "gguf"
    gguf_plain.spec = SimpleNamespace(drafter="none")
    harness = Harness(models.decoder, [dense_ref, gguf_first, dense, gguf_plain],
                      BenchSettings(GREEDY8, warmup_tokens=0, progress=False))
    assert harness._reference_for("dense") == "hf-generate"
    assert harness._reference_for("gguf") == "q-plain"  # plain decoding of that model, though listed later
    gguf_plain.spec = None
    assert harness._reference_for("gguf") == "q-fast"  # else its first method


def test_interleaving_rotates_order_and_warms_up_each_method(models):
    tokenizer = models.decoder.tokenizer
    methods = [EchoMethod(name, name, tokenizer) for name in ("a", "b", "c")]
    assert [m.label for m in rotated(methods, 4)] == ["b", "c", "a"]
    questions = [q(i, "qa", "Hi?") for i in range(3)]
    records = Harness(models.decoder, methods, BenchSettings(GREEDY8, warmup_tokens=4, progress=False,
                                                             reference="a")).run(questions)
    assert all(len(m.prompts) == 1 + 3 for m in methods)  # one warm-up each
    long_question = q(9, "summarization", "Summarize: " + "word " * 200)
    Harness(models.decoder, methods, BenchSettings(GREEDY8, warmup_tokens=4, progress=False, reference="a",
                                                   warmup_prompt_tokens=16)).run([long_question])
    full = models.decoder.encode(conversation(long_question, 0, [], chat=True))
    assert all(m.prompts[-2] == full[-16:] and m.prompts[-1] == full for m in methods)  # warm-up on the end only
    orders = [[r["order"] for r in records[i * 3:(i + 1) * 3]] for i in range(3)]
    assert orders == [[0, 1, 2], [2, 0, 1], [1, 2, 0]]  # who ran first moves along with each prompt


def test_greedy_methods_agree_with_hf_generate(models):
    names = ["hf-generate", "hf-assisted", "hf-prompt-lookup", "specwise-ar", "specwise:drafter=draft-model,k=3"]
    methods = [build_method(n, models, SpecConfig()) for n in names]
    records = Harness(models.decoder, methods, BenchSettings(GREEDY8, warmup_tokens=0, progress=False)).run(
        [q(1, "qa", "What is the capital of France?")])
    assert [r["check"] for r in records] == ["reference"] + ["identical"] * 4
    spec = records[-1]
    assert spec["steps"] >= 1 and spec["proposed"] >= spec["accepted"] >= 0 and spec["proposed_at"]
    assert spec["other_seconds"] >= 0 and spec["tau"] >= 1
    assert records[0]["steps"] == records[0]["new_tokens"]  # hf-generate: one forward pass per token


def test_mismatch_is_reported_and_classified(models, capsys, monkeypatch):
    reference = build_method("hf-generate", models, SpecConfig())
    corrupt = CorruptMethod(reference, position=2)
    question = q(1, "qa", "What is the capital of France?")
    settings = BenchSettings(GREEDY8, warmup_tokens=0, progress=False)
    harness = Harness(models.decoder, [reference, corrupt], settings)
    records = harness.run([question])
    bad = records[1]
    assert bad["match"] is False and bad["check"] == FAILURE and harness.mismatches == [bad]
    m = bad["mismatch"]
    assert m["position"] == 2 and m["classification"] == FAILURE
    assert m["reference_token"] == records[0]["token_ids"][2] and m["method_token"] == bad["token_ids"][2]
    assert m["reference_gap"] == 0.0 and m["method_gap"] > m["tolerance"]  # the target's own pick is its argmax
    assert "FAILURE MISMATCH: corrupt" in capsys.readouterr().err
    assert bad["mismatch"]["position"] == 2
    summary = summary_markdown(records, {"baseline": "hf-generate"})
    assert "**MISMATCHES vs hf-generate: 1 FAILURE, 0 numerical**" in summary and "**FAILURE**" in summary
    # Two methods leaving the reference at the same place share one plain pass of the target.
    passes = []
    real_pass = numerics.target_logits
    monkeypatch.setattr(numerics, "target_logits", lambda *a: passes.append(1) or real_pass(*a))
    twin = CorruptMethod(reference, position=2)
    twin.label = "corrupt-twin"
    twins = Harness(models.decoder, [reference, corrupt, twin], settings).run([question])
    assert [r["check"] for r in twins[1:]] == [FAILURE, FAILURE]
    assert twins[1]["mismatch"] == twins[2]["mismatch"] and len(passes) == 1
    # With a tolerance as wide as the logits' range the same divergence counts as rounding.
    loose = Harness(models.decoder, [reference, corrupt],
                    BenchSettings(GREEDY8, warmup_tokens=0, progress=False, tie_ulps=1e12)).run([question])
    assert loose[1]["check"] == NUMERICAL


def test_classification_rule():
    logits = torch.full((10,), -5.0)
    logits[3], logits[4], logits[5] = 20.0, 19.9, 19.0
    # bfloat16: eps 2^-7, tolerance 20 · 2^-7 ≈ 0.156: a 0.1 gap is within resolution, 1.0 is not.
    assert classify(logits, 3, 4, torch.bfloat16)["classification"] == NUMERICAL
    assert classify(logits, 3, 5, torch.bfloat16)["classification"] == FAILURE
    assert classify(logits, 3, 4, torch.float32)["classification"] == FAILURE
    assert classify(logits, 3, 5, torch.bfloat16, ulps=8)["classification"] == NUMERICAL
    assert classify(logits, 3, None, torch.bfloat16)["classification"] == FAILURE  # one stopped, one did not
    verdict = classify(logits, 3, 4, torch.bfloat16)
    assert verdict["top_token"] == 3 and abs(verdict["top2_margin"] - 0.1) < 1e-5
    assert abs(verdict["margin_ulps"] - 0.1 / (20 * 2 ** -7)) < 1e-4
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_check_identity_on_the_target(models):
    model = models.decoder.target.model
    prompt = models.decoder.encode("Hello there!")
    reference = build_method("hf-generate", models, SpecConfig()).generate(prompt, GREEDY8).token_ids
    assert check_identity(model, prompt, reference, list(reference)) is None
    shorter = check_identity(model, prompt, reference, reference[:-1])
    assert shorter.position == len(reference) - 1 and shorter.method_token is None
    assert shorter.classification == FAILURE


# --------------------------------------------------------------------------- aggregation


def record(task, method, tokens, seconds, family="hf", **stats):
    base = dict(question_id=0, category=task, task=task, turn=1, method=method, family=family,
                new_tokens=tokens, wall_seconds=seconds, steps=tokens, proposed=None, accepted=None,
                proposed_at=None, accepted_at=None, draft_seconds=None, score_seconds=None,
                verify_seconds=None, check="identical")
    return base | stats


def test_speedup_from_totals_and_tau_alpha_from_merged_stats():
    spec = dict(family="specwise", draft_seconds=0.1, score_seconds=0.5, verify_seconds=0.01)
    records = [
        record("qa", "hf-generate", 10, 1.0, check="reference"),
        record("qa", "hf-generate", 90, 9.0, check="reference"),   # 10 tokens/s either way
        record("qa", "fast", 10, 0.1, **spec, steps=2, proposed=8, accepted=8,
               proposed_at=[2, 2, 2, 2], accepted_at=[2, 2, 2, 2]),
        record("qa", "fast", 90, 9.0, **spec, steps=45, proposed=180, accepted=45,
               proposed_at=[45, 45, 45, 45], accepted_at=[45, 0, 0, 0], check=FAILURE),
        record("rag", "hf-generate", 20, 4.0, check="reference"),
        record("rag", "fast", 20, 2.0, **spec, steps=10, proposed=40, accepted=10,
               proposed_at=[10] * 4, accepted_at=[10, 0, 0, 0]),
    ]
    rows = aggregate(records, "hf-generate")
    qa = rows["qa", "fast"]
    assert qa.speedup == pytest.approx((100 / 9.1) / 10)  # not the mean of 10x and 1x
    assert qa.tau == pytest.approx((53 + 47) / 47)         # (accepted + steps) / steps over both
    assert qa.alpha == pytest.approx(53 / 188)
    assert qa.per_position == pytest.approx([47 / 47, 2 / 47, 2 / 47, 2 / 47])
    assert (qa.identical, qa.failures) == (1, 1)
    assert rows["rag", "fast"].speedup == pytest.approx(2.0)
    overall = rows[OVERALL, "fast"]
    assert overall.speedup == pytest.approx((120 / 11.1) / (120 / 14.0))
    assert overall.tau == pytest.approx((63 + 57) / 57)
    assert rows[OVERALL, "hf-generate"].speedup == 1.0 and rows[OVERALL, "hf-generate"].tau == 1.0
    assert rows[OVERALL, "hf-generate"].tau_kind == "forwards" and rows[OVERALL, "hf-generate"].alpha is None
    # every task weighs alike in the task mean: sqrt(qa's speedup x rag's 2.0), unlike the pooled overall
    assert task_mean_speedup(rows, ["qa", "rag"], "fast") == pytest.approx(math.sqrt(qa.speedup * 2.0))
    assert task_mean_speedup(rows, ["qa", "rag", "math_reasoning"], "fast") is None  # a task it lacks
    text = summary_markdown(records, {"baseline": "hf-generate", "command": "specwise bench run"})
    assert "## Speedup vs hf-generate by task" in text and "| qa |" in text and "1 FAILURE" in text
    assert f"| task mean (geometric) | 1.000 | {math.sqrt(qa.speedup * 2.0):.3f} |" in text


def test_cpu_probe_sees_another_busy_process():
    """A benchmark timing must know when another process took CPU time from it."""
    import subprocess
    import sys
    import time

    from specwise.bench.machine import CpuProbe

    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.2)  # let it start spinning
        probe = CpuProbe()
        time.sleep(1.0)
        share = probe.other_share()
    finally:
        busy.wait()
    assert share is not None and share > 0.5 / (os.cpu_count() or 1)  # one spinning core of all of them


def test_report_flags_contended_timings():
    records = [dict(question_id=1, category="qa", task="qa", turn=1, method=m, family="hf", new_tokens=10,
                    wall_seconds=2.0, tau=None, alpha=None, check="identical", other_cpu=share)
               for m, share in (("hf-generate", 0.0), ("specwise-ar", 0.3))]
    text = summary_markdown(records, {"baseline": "hf-generate"})
    assert "1 of 2 generations ran while other processes used more than 5%" in text
    assert "| 1 | 1 | specwise-ar | 30.0% |" in text and "timed again" not in text
    records[0]["retakes"] = 1
    assert "1 generation(s) were timed again" in summary_markdown(records, {"baseline": "hf-generate"})


def test_a_contended_timing_is_taken_again(models, monkeypatch, capsys):
    """Another process on the CPU spoils a timing: the harness runs that generation again."""
    import specwise.bench.harness as harness_module

    shares = iter([0.4, 0.3, 0.0,  # method a: two contended timings, then a clean one
                   0.5, 0.6, 0.7])  # method b: contended every time, out of retakes: kept and flagged

    class FakeProbe:
        def other_share(self):
            return next(shares)

    monkeypatch.setattr(harness_module, "CpuProbe", FakeProbe)
    tokenizer = models.decoder.tokenizer
    a, b = EchoMethod("a", "yes", tokenizer), EchoMethod("b", "yes", tokenizer)
    settings = BenchSettings(GREEDY8, warmup_tokens=0, progress=False, reference="a", retakes=2)
    records = Harness(models.decoder, [a, b], settings).run([q(1, "qa", "Hi?")])
    assert len(a.prompts) == len(b.prompts) == 3  # one timing and two retakes each
    assert [(r["method"], r["retakes"], r["other_cpu"]) for r in records] == [("a", 2, 0.0), ("b", 2, 0.7)]
    err = capsys.readouterr().err
    assert err.count("timing it again") == 4 and "70% of the CPU\n" in err


def test_a_drafter_that_remembers_is_not_timed_again(models, monkeypatch, capsys):
    """A rerun of a suffix or recycle method would draft from its first run's answer: its contended
    timing is kept and flagged, never replaced by a run that had seen the answer."""
    import specwise.bench.harness as harness_module
    from specwise.bench.methods import SpecwiseMethod

    class Contended:
        def other_share(self):
            return 0.5

    monkeypatch.setattr(harness_module, "CpuProbe", Contended)
    methods = {name: SpecwiseMethod(name, name, models.decoder, SpecConfig(drafter=name, k=2))
               for name in ("ngram", "suffix", "recycle")}
    assert {name: m.repeatable for name, m in methods.items()} == {"ngram": True, "suffix": False, "recycle": False}
    settings = BenchSettings(GREEDY8, warmup_tokens=0, progress=False, reference="ngram", retakes=1)
    records = Harness(models.decoder, list(methods.values()), settings).run([q(1, "qa", "Hi?")])
    assert {r["method"]: r["retakes"] for r in records} == {"ngram": 1, "suffix": 0, "recycle": 0}
    assert capsys.readouterr().err.count("timing it again") == 1


def test_resume_bookkeeping_finished_torn_and_contended_questions(tmp_path):
    from specwise.bench.resume import check_same_run, finished_questions, read_partial_records

    questions = [q(1, "writing", "a?", "b?"), q(2, "qa", "c?"), q(3, "qa", "d?")]
    rec = lambda qid, method, turn, cpu=0.0: dict(question_id=qid, method=method, turn=turn, other_cpu=cpu)  # noqa: E731
    records = [rec(1, "m", 1), rec(1, "n", 1), rec(1, "m", 2),  # q1: n's second turn missing
               rec(2, "m", 1), rec(2, "n", 1, cpu=0.3),         # q2: finished, one timing contended
               rec(3, "m", 1), rec(3, "n", 1)]                  # q3: finished
    kept, done = finished_questions(records, questions, ["m", "n"])
    assert done == {2, 3} and len(kept) == 4
    kept, done = finished_questions(records, questions, ["m", "n"], redo_contended=True)
    assert done == {3} and [r["question_id"] for r in kept] == [3, 3]

    path = tmp_path / "records.jsonl"
    path.write_text('{"question_id": 1}\n{"question_id": 2}\n{"quest')
    assert read_partial_records(path) == [{"question_id": 1}, {"question_id": 2}]  # the torn last line goes
    path.write_text('{"question_id": 1}\nnot json\n{"question_id": 2}\n')
    with pytest.raises(ValueError, match="records.jsonl:2 is not a JSON record"):
        read_partial_records(path)

    meta = {"target": "t", "methods": [{"label": "m"}], "sampling": {"temperature": 0.0, "stop": ()}}
    check_same_run(json.loads(json.dumps(meta)), meta)  # a JSON round trip is the same run
    with pytest.raises(ValueError, match=r"cannot resume.*target: was 't', now 'u'"):
        check_same_run(meta, {**meta, "target": "u"})


def test_methods_sharing_a_drafter_each_read_the_whole_prompt(models):
    """Two configurations of one draft model share its drafter (and its cache); the second must
    not find the prompt already read, or its timing would skip the drafter's prefill."""
    first, second = (build_method(f"specwise:drafter=draft-model,k={k}", models, SpecConfig()) for k in (2, 3))
    drafter = models.decoder.drafter_for(second.spec)
    assert models.decoder.drafter_for(first.spec) is drafter
    prompt = models.decoder.encode("Tell me about the sea and the sky.")
    first.generate(prompt, GREEDY8)
    fed: list[int] = []
    forward = drafter.runner.forward
    drafter.runner.forward = lambda ids, **kw: fed.append(len(ids)) or forward(ids, **kw)
    try:
        second.generate(prompt, GREEDY8)
    finally:
        del drafter.runner.forward
    assert fed[0] == len(prompt) - 1  # the whole prompt (its last token comes with the first proposal)
