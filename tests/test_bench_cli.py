"""`specwise bench run | cost | report` end to end on tiny models saved as model directories."""

from __future__ import annotations

import argparse
import json
import re
import sys

import pytest
import torch

from specwise.bench import cost
from specwise.bench.cli import method_names
from specwise.cli import build_parser, main
from specwise.testing import tiny_loaded

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a poem about the sea.", "Now make it shorter."]},
    {"question_id": 2, "category": "qa", "turns": ["What is the capital of France?"]},
    {"question_id": 3, "category": "qa", "turns": ["Who wrote Hamlet?"]},
]
METHODS = ["hf-generate", "hf-assisted", "hf-prompt-lookup", "specwise-ar"]


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    dirs = []
    for seed in (0, 1):
        loaded = tiny_loaded(seed)
        loaded.model.save_pretrained(root / f"tiny{seed}")
        loaded.tokenizer.save_pretrained(root / f"tiny{seed}")
        dirs.append(str(root / f"tiny{seed}"))
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps(x) + "\n" for x in QUESTIONS))
    return dirs[0], dirs[1], str(questions)


def run_cli(monkeypatch, argv: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["specwise"] + argv)  # the summary records the command as typed
    return main(argv)


def test_bench_run_end_to_end(tiny_dirs, tmp_path, capsys, monkeypatch):
    target, drafter, questions = tiny_dirs
    out = tmp_path / "run"
    code = run_cli(monkeypatch, ["bench", "run", "--target", target, "--drafter-model", drafter, "--dtype", "float32",
                 "--threads", "1", "--questions", questions, "--questions-per-task", "1", "--max-new-tokens", "8",
                 "--warmup-tokens", "4", "--out", str(out), "--no-progress",
                 "--methods", ",".join(METHODS) + ",specwise:drafter=draft-model",
                 "--methods", f"specwise:drafter=draft-model,k=3,model={target},label=self-draft"])
    assert code == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    labels = METHODS + ["specwise-draft-model-adaptive1-12", "self-draft"]  # greedy: adaptive "auto" is adaptive
    # 2 questions (one per task): the writing one has two turns.
    assert len(records) == 3 * len(labels)
    assert {(r["question_id"], r["turn"]) for r in records} == {(1, 1), (1, 2), (2, 1)}
    by_prompt: dict = {}
    for r in records:
        by_prompt.setdefault((r["question_id"], r["turn"]), {})[r["method"]] = r
    for group in by_prompt.values():
        assert set(group) == set(labels)
        reference = group["hf-generate"]["token_ids"]
        assert all(r["token_ids"] == reference for r in group.values())
        assert all(r["check"] in ("reference", "identical") for r in group.values())
    self_draft = [r for r in records if r["method"] == "self-draft"]
    assert sum(r["accepted"] for r in self_draft) == sum(r["proposed"] for r in self_draft) > 0  # drafter = target
    for r in records:
        assert r["new_tokens"] == len(r["token_ids"]) and r["wall_seconds"] > 0 and r["tokens_per_second"] > 0
        assert r["task"] == ("multi-turn conversation" if r["category"] == "writing" else "qa")
    summary = (out / "summary.md").read_text()
    for text in ("## Speedup vs hf-generate by task", "multi-turn conversation", "| qa |", "torch threads",
                 "transformers", "target weights: dense float32", "specwise bench run --target", "self-draft",
                 "- specwise 0.1.0 at ", "read bandwidth"):
        assert text in summary
    assert "MISMATCH" not in summary
    assert (out / "speedup.png").stat().st_size > 1000 and (out / "tau.png").stat().st_size > 1000
    meta = json.loads((out / "run.json").read_text())
    assert meta["baseline"] == "hf-generate" and meta["finished"]
    assert "overall" in capsys.readouterr().err
    provenance = meta["provenance"]  # the code, machine and date a number came from (bench/provenance.py)
    assert len(provenance["specwise"]["commit"]) == 40 and isinstance(provenance["specwise"]["dirty"], bool)
    assert provenance["machine"]["read_bandwidth_gbs"] > 0 and provenance["machine"]["cores"] >= 1
    assert provenance["command"].startswith("specwise bench run") and provenance["date"][:4].isdigit()
    assert meta["machine"]["dtype"] == "float32" and meta["target_format"] == "dense"

    (out / "summary.md").unlink()
    assert main(["bench", "report", str(out)]) == 0
    assert (out / "summary.md").read_text().startswith("# specwise bench")

    some = tmp_path / "some"
    assert main(["bench", "report", str(out), "--out", str(some), "--methods", "hf-generate,specwise-ar"]) == 0
    text = (some / "summary.md").read_text()
    assert "| specwise-ar |" in text and "| self-draft |" not in text
    assert {json.loads(line)["method"] for line in (some / "records.jsonl").read_text().splitlines()} == \
        {"hf-generate", "specwise-ar"}
    capsys.readouterr()
    assert main(["bench", "report", str(out), "--out", str(some), "--methods", "specwise-ar"]) != 0
    assert "must include the baseline 'hf-generate'" in capsys.readouterr().err


@pytest.mark.parametrize("text, names", [
    ("hf-generate,specwise-ar", ["hf-generate", "specwise-ar"]),
    ("specwise:drafter=ngram,k=4", ["specwise:drafter=ngram,k=4"]),
    ("hf-generate,specwise:drafter=ngram,k=4,specwise-ar,specwise:drafter=suffix,tree_shape=3x2x1,label=t",
     ["hf-generate", "specwise:drafter=ngram,k=4", "specwise-ar", "specwise:drafter=suffix,tree_shape=3x2x1,label=t"]),
    (" specwise , hf-generate ,, ", ["specwise", "hf-generate"]),
])
def test_methods_split_into_methods_with_their_options(text, names):
    assert method_names(text) == names


@pytest.mark.parametrize("text, fragment", [
    ("k=4,hf-generate", "'k=4' comes first"),
    ("hf-generate,k=4", "'k=4' comes after 'hf-generate'"),
    ("specwise,k=4", "write it inside one, e.g. specwise:k=4"),
    (",", "at least one method"),
])
def test_an_option_outside_a_specwise_method_is_refused(text, fragment):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(fragment)):
        method_names(text)


def test_methods_is_repeatable_and_its_options_stay_with_their_method(capsys):
    parser = build_parser()
    args = parser.parse_args(["bench", "run", "--methods", "hf-generate,specwise:drafter=ngram,k=4",
                              "--methods", "specwise-ar"])
    assert args.methods == ["hf-generate", "specwise:drafter=ngram,k=4", "specwise-ar"]
    assert parser.parse_args(["bench", "run"]).methods is None  # the built-ins, chosen in cmd_run
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "run", "--methods", "hf-generate", "--methods", "k=4"])
    assert "'k=4' comes first" in capsys.readouterr().err


@pytest.mark.parametrize("extra, meant", [
    ([], "hf-generate,hf-assisted,hf-prompt-lookup,specwise-ar,specwise:drafter=ngram,k=4"),  # added to the built-ins
    (["--methods", "hf-generate"], "hf-generate,specwise:drafter=ngram,k=4"),
])
def test_the_retired_method_flag_is_refused_naming_its_methods(extra, meant, tmp_path, capsys):
    # refused before anything is read or loaded: the target does not exist
    assert main(["bench", "run", "--target", str(tmp_path / "nothing"), *extra,
                 "--method", "specwise:drafter=ngram,k=4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"give --methods {meant}" in err
    # negative control: the same command without --method gets past that check, to the missing target
    assert main(["bench", "run", "--target", str(tmp_path / "nothing"), *extra,
                 "--methods", "specwise:drafter=ngram,k=4", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "unknown model" in err and "--method" not in err


def test_bench_sweep_k(tiny_dirs, tmp_path):
    target, drafter, questions = tiny_dirs
    out = tmp_path / "sweep"
    code = main(["bench", "--target", target, "--drafter-model", drafter, "--dtype", "float32", "--threads", "1",
                 "--questions", questions, "--tasks", "qa", "--questions-per-task", "1", "--max-new-tokens", "6",
                 "--warmup-tokens", "0", "--out", str(out), "--no-progress", "--methods", "hf-generate",
                 "--methods", "specwise:drafter=ngram", "--sweep-k", "1,3"])
    assert code == 0
    methods = {json.loads(line)["method"] for line in (out / "records.jsonl").read_text().splitlines()}
    assert methods == {"hf-generate", "specwise-ngram-k1", "specwise-ngram-k3"}
    assert "## Sweep over k" in (out / "summary.md").read_text()
    assert (out / "sweep_k.png").is_file()


def test_bench_cost_on_tiny_models(tiny_dirs, tmp_path, monkeypatch, capsys):
    target, drafter, _ = tiny_dirs
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    out = tmp_path / "cost"
    code = main(["bench", "cost", "--target", target, "--drafter-model", drafter, "--dtype", "float32",
                 "--threads", "1", "--n", "2,4", "--contexts", "16,64,4096", "--repeats", "2",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    results = json.loads((out / "cost.json").read_text())["results"]
    assert [(r["model"], r["runner"]) for r in results] == [
        (target, "hf"), (target, "lean"), (drafter, "hf"), (drafter, "lean")]  # both runners, side by side
    for result in results:
        assert result["ns"] == [1, 2, 4] and result["skipped_contexts"] == [4096]  # beyond the 512 window
        assert set(result["seconds"]) == {"16", "64"}
        assert all(t > 0 for times in result["seconds"].values() for t in times.values())
        saved = cost.cost_path(result["model"], "float32", 1, result["runner"])
        assert saved.is_relative_to(tmp_path / "home" / "cost") and cost.load(saved)["seconds"] == result["seconds"]
    assert (out / "cost.png").stat().st_size > 1000
    assert "T(n) of" in capsys.readouterr().out


def test_bench_cost_measures_each_thread_count_in_turn(tiny_dirs, tmp_path, monkeypatch, capsys):
    import torch

    target, _, _ = tiny_dirs
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    before = torch.get_num_threads()
    out = tmp_path / "cost"
    # the read bandwidth is measured at each count: here a stand-in that tells the counts apart
    monkeypatch.setattr("specwise.bench.machine.memory_bandwidth", lambda: 10.0 * torch.get_num_threads())
    try:
        assert main(["bench", "cost", "--target", target, "--drafter-model", "none", "--dtype", "float32",
                     "--runners", "lean", "--threads", "1,2", "--n", "2", "--contexts", "16", "--repeats", "1",
                     "--out", str(out), "--no-progress"]) == 0
    finally:
        torch.set_num_threads(before)
    results = json.loads((out / "cost.json").read_text())["results"]
    assert [(r["runner"], r["threads"]) for r in results] == [("lean", 1), ("lean", 2)]
    assert [(r["machine"]["read_bandwidth_gb_s"], r["machine"]["read_bandwidth_threads"]) for r in results] == [
        (10.0, 1), (20.0, 2)]
    for threads in (1, 2):  # each count's table where the adaptive tuner looks for it
        assert cost.cost_path(target, "float32", threads, "lean").is_file()
    assert main(["bench", "cost", "--target", target, "--threads", "2,0", "--no-progress", "--out", str(out)]) != 0
    assert "--threads must be >= 1; got 0" in capsys.readouterr().err


def test_cost_function_interpolates():
    table = {"model": "m", "seconds": {"128": {"1": 1.0, "2": 1.0, "4": 2.0}, "1024": {"1": 3.0, "4": 6.0}}}
    t = cost.cost_function(table, context=200)
    assert (t(1), t(2), t(3), t(4), t(6)) == (1.0, 1.0, 1.5, 2.0, 3.0)
    assert cost.cost_function(table, context=900)(2) == 4.0


def test_measure_through_the_runner():
    result = cost.measure(tiny_loaded(0), contexts=(8,), ns=(3,), repeats=1)
    assert result["ns"] == [1, 3] and set(result["seconds"]["8"]) == {"1", "3"}
    assert result["dtype"] == "float32" and result["threads"] == torch.get_num_threads()


def _resume_argv(target, drafter, questions, out, *extra):
    return ["bench", "run", "--target", target, "--drafter-model", drafter, "--dtype", "float32", "--threads", "1",
            "--questions", questions, "--questions-per-task", "2", "--max-new-tokens", "6", "--warmup-tokens", "0",
            "--out", str(out), "--no-progress", "--methods", "hf-generate,specwise-ar,specwise:drafter=ngram,k=2",
            *extra]


def _records(out):
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def test_bench_resume_keeps_finished_questions_and_reruns_the_rest(tiny_dirs, tmp_path, monkeypatch, capsys):
    target, drafter, questions = tiny_dirs
    out = tmp_path / "run"
    assert run_cli(monkeypatch, _resume_argv(target, drafter, questions, out)) == 0
    full = _records(out)
    key = lambda r: (r["question_id"], r["turn"], r["method"])  # noqa: E731
    assert len(full) == 4 * 3  # q1 (two turns), q2, q3; three methods
    # A run stopped during question 1's second turn: question 2 finished, question 1 half done, a torn line.
    by_question = {qid: [r for r in full if r["question_id"] == qid] for qid in (1, 2, 3)}
    stopped = by_question[2] + by_question[1][:4]
    marker = {"question_id": 2, "method": "hf-generate", "turn": 1}
    meta = json.loads((out / "run.json").read_text())
    del meta["finished"]
    (out / "run.json").write_text(json.dumps(meta))
    for r in stopped:
        r["wall_seconds"] = 123.0  # marks the kept records: a rerun would measure anew
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stopped) + '{"question_id": 1, "me')

    # Without --resume an earlier run is never overwritten; the check comes before any model loads.
    assert main(_resume_argv(target, "/nonexistent", questions, out)) != 0
    assert re.search("already holds a run.*--resume", capsys.readouterr().err)
    # A resumed run must measure the same thing.
    assert main(_resume_argv(target, drafter, questions, out, "--methods", "specwise:drafter=ngram,k=3",
                             "--resume")) != 0
    assert re.search("cannot resume.*methods", capsys.readouterr().err)
    assert run_cli(monkeypatch, _resume_argv(target, drafter, questions, out, "--resume")) == 0

    resumed = _records(out)
    assert sorted(map(key, resumed)) == sorted(map(key, full))  # every prompt once, none twice
    kept = [r for r in resumed if r["wall_seconds"] == 123.0]
    assert {r["question_id"] for r in kept} == {marker["question_id"]}  # q1's half is run again, not kept
    assert len(kept) == 3
    by_key = {key(r): r for r in full}
    for r in resumed:  # greedy: the rerun questions give the same tokens, in the same method order
        assert r["token_ids"] == by_key[key(r)]["token_ids"]
        assert r["order"] == by_key[key(r)]["order"]
    meta = json.loads((out / "run.json").read_text())
    assert meta["finished"] and len(meta["resumed"]) == 1
    assert "| qa |" in (out / "summary.md").read_text()


def test_bench_resume_needs_an_earlier_run(tiny_dirs, tmp_path, capsys):
    target, drafter, questions = tiny_dirs
    assert main(_resume_argv(target, drafter, questions, tmp_path / "empty", "--resume")) != 0
    assert "no run.json" in capsys.readouterr().err
    assert main(["bench", "run", "--resume", "--questions", questions]) != 0
    assert "name that directory" in capsys.readouterr().err


def test_runners_of_a_model_take_turns_on_the_same_tokens():
    """bench cost times a model's runners side by side: turn by turn within each point, same ids."""
    calls = []

    class Fake:
        vocab, max_context = 50, 64

        def __init__(self, name, seconds):
            self.name, self.seconds = name, seconds

        def start(self, context_ids):
            calls.append((self.name, "start", tuple(context_ids)))

        def time(self, ids):
            calls.append((self.name, "time", tuple(ids)))
            return self.seconds * len(ids)

        def describe(self):
            return {"model": "m", "runner": self.name, "dtype": "x", "threads": 1, "machine": {}}

    results = cost.measure_side_by_side([Fake("a", 0.01), Fake("b", 0.03)], contexts=(8, 100), ns=(2,), repeats=4)
    assert [r["runner"] for r in results] == ["a", "b"]
    assert results[0]["seconds"] == {"8": {"1": 0.01, "2": 0.02}} and results[1]["seconds"]["8"]["2"] == 0.06
    assert all(r["skipped_contexts"] == [100] and r["side_by_side"] == 2 for r in results)  # 100 + 2 > 64
    assert {ids for name, what, ids in calls if name == "a"} == {ids for name, what, ids in calls if name == "b"}
    timed = [name for name, what, ids in calls if what == "time" and len(ids) == 2][-8:]  # n = 2, after warm-ups
    assert timed == ["a", "b", "b", "a", "a", "b", "b", "a"]  # turns, in a rotated order


@pytest.mark.parametrize("assisted", [False, True])
def test_specwise_methods_get_the_drafter_by_name(tiny_dirs, tmp_path, monkeypatch, assisted):
    """The draft-model drafter is made by its factory from the drafter's name, as `specwise generate`
    makes it, so beside a GGUF target a GGUF drafter runs its own blocks; only Hugging Face's assisted
    generation takes a loaded dense model (the control: then, and only then, the bench loads one)."""
    from specwise.api import SpecDecoder
    from specwise.store import loading

    target, drafter, questions = tiny_dirs
    bench_loads, decoders = [], []
    real_load = loading.load_model

    def recording_load(name, *args, **kwargs):
        if sys._getframe(1).f_globals["__name__"] == "specwise.bench.cli":  # not the drafter factory's loads
            bench_loads.append(str(name))
        return real_load(name, *args, **kwargs)

    def recording_decoder(*args, **kwargs):
        decoders.append(kwargs.get("drafter_model"))
        return SpecDecoder(*args, **kwargs)

    monkeypatch.setattr(loading, "load_model", recording_load)  # what cmd_run imports
    monkeypatch.setattr("specwise.api.SpecDecoder", recording_decoder)
    methods = ["specwise-ar"] + (["hf-assisted"] if assisted else [])
    code = run_cli(monkeypatch, ["bench", "run", "--target", target, "--drafter-model", drafter, "--dtype", "float32",
                                 "--threads", "1", "--questions", questions, "--questions-per-task", "1",
                                 "--max-new-tokens", "4", "--warmup-tokens", "2", "--out", str(tmp_path / "run"),
                                 "--no-progress", "--methods", ",".join(methods + ["specwise:drafter=draft-model,k=2"])])
    assert code == 0
    assert decoders == [drafter]  # by name: the factory chooses the drafter's format beside the target
    assert (drafter in bench_loads) == assisted
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["drafter_model"] == drafter
