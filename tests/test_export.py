"""`specwise export`: default configurations as vLLM, SGLang and llama-server settings, checked against
each engine's documented key list; notes where an engine has no equivalent; the best method of a bench."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from specwise.bench.cli import _write_json
from specwise.bench.harness import make_record
from specwise.bench.methods import describe_spec, parse_specwise_method, spec_label
from specwise.bench.prompts import Question
from specwise.bench.types import MethodOutput
from specwise.cli import main
from specwise.config import SpecConfig
from specwise.export import (ENGINES, EngineTable, ExportError, KeyList, Subject, UnknownKeyError, best_from_bench,
                             engine_table, export_to, key_list)
from specwise.export.from_bench import spec_from_description
from specwise.export.table import Method
from specwise.stats import SpecStats
from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET

# The default configurations, written as bench method specs (parsed by the bench's own parser).
CONFIGS = {
    "default": "specwise",  # n-gram drafting, adaptive "auto"
    "ngram": "specwise:drafter=ngram,k=4,adaptive=0",
    "adaptive-ngram": "specwise:drafter=ngram,adaptive=1",
    "draft-model": "specwise:drafter=draft-model,k=4,adaptive=0",
    "eagle": "specwise:drafter=eagle",
    "suffix": "specwise:drafter=suffix,k=16,adaptive=0",
    "recycle": "specwise:drafter=recycle",
    "layerskip": "specwise:drafter=layerskip,k=3,adaptive=0",
    "tree": "specwise:drafter=draft-model,tree_nodes=16,tree_depth=4,tree_branching=3",
}


def subject(name: str, **extra) -> Subject:
    spec, model, label = parse_specwise_method(CONFIGS[name], SpecConfig())
    draft = (model or DEFAULT_DRAFTER) if spec.drafter == "draft-model" else None
    return Subject(spec=spec, target=DEFAULT_TARGET, draft_model=draft, label=label or spec_label(spec), **extra)


def emitted(export) -> tuple[dict, dict]:
    """(configuration keys, command-line flags) an export emitted, read back from its command line."""
    # after the program: `vllm serve TARGET`, `python -m sglang.launch_server`, `llama-server`
    argv = export.command[{"vllm": 3, "sglang": 3, "llama-server": 1}[export.engine]:]
    flags = {a: (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None)
             for i, a in enumerate(argv) if a.startswith("-")}
    config = json.loads(flags["--speculative-config"]) if export.engine == "vllm" else {}
    return config, flags


def notes_of(export) -> str:
    return "\n".join(export.notes)


# --------------------------------------------------------------------------- key lists


def test_key_lists_record_their_source_and_version():
    for engine in ENGINES:
        keys = key_list(engine)
        assert keys.flags, engine
        assert "commit" in keys.version and keys.sources[0]["url"].startswith("https://github.com/")
        # The commit named in the version is the one the source URL points at.
        commit = keys.version.split("commit ")[1].split()[0]
        assert commit in keys.sources[0]["url"]
    assert "num_speculative_tokens" in key_list("vllm").keys
    assert "--draft-max" not in key_list("llama-server").flags  # removed in the pinned version


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("engine", ENGINES)
def test_default_configurations_emit_only_documented_keys(engine, name):
    export = export_to(engine, subject(name))
    keys = key_list(engine)
    config, flags = emitted(export)
    assert set(config) <= keys.keys, set(config) - keys.keys
    assert set(flags) <= keys.flags, set(flags) - keys.flags
    for key, value in [*config.items(), *flags.items()]:
        if key in keys.choices:
            assert str(value) in keys.choices[key], (key, value)
    keys.check(config, flags)  # the validator agrees with the reading above
    assert export.settings and export.method


# A key each exporter emits for the default n-gram configuration.
EMITTED = {"vllm": "prompt_lookup_min", "sglang": "--speculative-num-draft-tokens",
           "llama-server": "--spec-ngram-simple-size-m"}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_validator_refuses_an_invented_key(engine, monkeypatch):
    keys = key_list(engine)
    with pytest.raises(UnknownKeyError, match="speculative_magic"):
        keys.check({"speculative_magic": 1}, {})
    with pytest.raises(UnknownKeyError, match="--speculative-magic"):
        keys.check({}, {"--speculative-magic": 1})
    choice = next(iter(keys.choices))
    with pytest.raises(UnknownKeyError, match="telepathy"):
        keys.check({}, {choice: "telepathy"}) if choice.startswith("-") else keys.check({choice: "telepathy"}, {})
    # An exporter whose output holds a key the engine's list lacks is refused before anything is printed:
    # the same export with that key struck from the list.
    export_to(engine, subject("ngram"))
    struck = dataclasses.replace(keys, keys=keys.keys - {EMITTED[engine]}, flags=keys.flags - {EMITTED[engine]})
    monkeypatch.setattr("specwise.export.table.key_list", lambda name: struck)
    with pytest.raises(UnknownKeyError, match=EMITTED[engine]):
        export_to(engine, subject("ngram"))


def undeclared_keys(table: EngineTable, keys: KeyList) -> set[str]:
    """The keys and flags a table declares that the engine's key list lacks."""
    documented = keys.keys | keys.flags
    return table.declared_keys() - documented


@pytest.mark.parametrize("engine", ENGINES)
def test_every_key_a_table_declares_is_in_the_engines_key_list(engine):
    table = engine_table(engine)
    assert table.keys == engine and EMITTED[engine] in table.declared_keys()
    assert not undeclared_keys(table, key_list(engine))
    # Every settings key goes where the engine reads it: vLLM's into its config object, the rest as flags.
    where = key_list(engine).keys if table.config_flag else key_list(engine).flags
    assert {key for method in table.methods.values() for key in method.settings} | set(table.after) <= where
    # negative control: a method with an invented key is found
    invented = dataclasses.replace(table, methods={**table.methods, "ngram": Method({"--spec-magic": 1})})
    assert undeclared_keys(invented, key_list(engine)) == {"--spec-magic"}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_drafter_without_a_table_entry_is_refused(engine):
    with pytest.raises(ExportError, match="no equivalent of specwise's drafter 'home-made'"):
        export_to(engine, Subject(spec=SpecConfig(drafter="home-made")))


# --------------------------------------------------------------------------- mappings


def test_vllm_mappings():
    ngram = export_to("vllm", subject("ngram")).settings
    assert ngram == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                     "prompt_lookup_max": 4, "rejection_sample_method": "block"}
    draft = export_to("vllm", subject("draft-model")).settings
    assert draft["method"] == "draft_model" and draft["model"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert draft["num_speculative_tokens"] == 4 and "use_heterogeneous_vocab" not in draft
    suffix = export_to("vllm", subject("suffix")).settings
    assert suffix["method"] == "suffix" and suffix["suffix_decoding_max_tree_depth"] == 48
    assert suffix["suffix_decoding_min_token_prob"] == pytest.approx(0.10)
    eagle = export_to("vllm", subject("eagle"))
    assert eagle.settings["method"] == "eagle3" and "convert" in notes_of(eagle)
    tree = export_to("vllm", subject("tree"))
    assert tree.settings["num_speculative_tokens"] == 4 and "no tree key" in notes_of(tree)
    assert "rejection_sample_method" not in tree.settings  # block verification has no tree form
    token = Subject(spec=SpecConfig(verifier="token"))
    assert export_to("vllm", token).settings["rejection_sample_method"] == "standard"


def test_sglang_mappings():
    draft = export_to("sglang", subject("draft-model")).settings
    assert draft["--speculative-algorithm"] == "STANDALONE"
    assert (draft["--speculative-num-steps"], draft["--speculative-eagle-topk"],
            draft["--speculative-num-draft-tokens"]) == (4, 1, 5)
    tree = export_to("sglang", subject("tree")).settings
    assert (tree["--speculative-num-steps"], tree["--speculative-eagle-topk"],
            tree["--speculative-num-draft-tokens"]) == (4, 3, 17)
    eagle = export_to("sglang", subject("eagle"))
    assert eagle.settings["--speculative-algorithm"] == "EAGLE3" and "convert" in notes_of(eagle)
    assert export_to("sglang", subject("ngram")).settings["--speculative-algorithm"] == "NGRAM"
    suffix = export_to("sglang", subject("suffix")).settings
    assert suffix["--speculative-ngram-match-type"] == "PROB"
    adaptive = Subject(spec=SpecConfig(drafter="draft-model", adaptive=True), draft_model=DEFAULT_DRAFTER)
    assert "--speculative-adaptive" in export_to("sglang", adaptive).settings
    auto = Subject(spec=SpecConfig(drafter="draft-model"), draft_model=DEFAULT_DRAFTER)  # adaptive "auto"
    assert "--speculative-adaptive" in export_to("sglang", auto).settings
    assert "--speculative-adaptive" not in draft


def test_llama_server_mappings():
    draft = export_to("llama-server", subject("draft-model"))
    assert draft.settings["--spec-type"] == "draft-simple"
    assert draft.settings["--spec-draft-model"] == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert draft.settings["--spec-draft-n-max"] == 4
    assert draft.command[:3] == ["llama-server", "-m", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"]
    ngram = export_to("llama-server", subject("ngram")).settings
    assert ngram["--spec-type"] == "ngram-simple" and ngram["--spec-ngram-simple-size-m"] == 4
    assert export_to("llama-server", subject("eagle")).settings["--spec-type"] == "draft-eagle3"
    assert export_to("llama-server", subject("suffix")).settings["--spec-type"] == "ngram-cache"


# --------------------------------------------------------------------------- notes


@pytest.mark.parametrize("engine", ENGINES)
def test_notes_where_the_engine_has_no_equivalent(engine):
    assert "recycle" in notes_of(export_to(engine, subject("recycle")))
    assert "layerskip" in notes_of(export_to(engine, subject("layerskip")))
    adaptive = notes_of(export_to(engine, subject("adaptive-ngram")))
    assert "adaptive k" in adaptive and "--from-bench" in adaptive
    assert "fixed k" in adaptive
    default = notes_of(export_to(engine, subject("default")))  # adaptive "auto": adaptive k for most requests
    assert "adaptive k" in default and "'auto'" in default and "seeded sampled" in default
    assert "adaptive k" not in notes_of(export_to(engine, subject("ngram")))
    quantized = Subject(spec=SpecConfig(drafter="draft-model", draft_quantize="int8", draft_vocab=32768),
                        target=DEFAULT_TARGET, draft_model=DEFAULT_DRAFTER)
    text = notes_of(export_to(engine, quantized))
    assert "int8" in text and "restricted draft vocabulary" in text
    other = Subject(spec=SpecConfig(drafter="draft-model"), target=DEFAULT_TARGET, draft_model="smollm2-135m")
    assert "another tokenizer" in notes_of(export_to(engine, other))
    block = notes_of(export_to(engine, subject("ngram")))
    if engine == "vllm":  # the pinned vLLM has block verification
        assert "block verification" not in block
    else:
        assert "block verification" in block and "still lossless" in block
    if engine != "vllm":
        assert "suffix" in notes_of(export_to(engine, subject("suffix")))


def test_vllm_drafts_with_another_vocabulary_by_intersection():
    other = Subject(spec=SpecConfig(drafter="draft-model"), target=DEFAULT_TARGET, draft_model="smollm2-135m")
    export = export_to("vllm", other)
    assert export.settings["use_heterogeneous_vocab"] is True
    assert export.settings["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_adaptive_k_exports_the_measured_mean():
    measured = subject("adaptive-ngram", mean_k=5.6)
    for engine in ENGINES:
        export = export_to(engine, measured)
        assert "5.60" in notes_of(export)
    assert export_to("vllm", measured).settings["num_speculative_tokens"] == 6


def test_errors():
    with pytest.raises(ExportError, match="unknown engine"):
        export_to("tgi", subject("ngram"))
    with pytest.raises(ExportError, match="plain decoding"):
        export_to("vllm", Subject(spec=SpecConfig(drafter="none")))


# --------------------------------------------------------------------------- --from-bench


BASELINE = "hf-generate"
# (task -> (new tokens, seconds)) per method: ngram wins the task mean, the adaptive draft model the
# pooled speedup; plain decoding through the engine (specwise-ar) is fastest but has nothing to export.
TIMINGS = {
    BASELINE: {"qa": (100, 10.0), "rag": (100, 10.0)},
    "specwise:drafter=ngram,k=4,adaptive=0": {"qa": (100, 5.0), "rag": (100, 10.0)},
    "specwise:drafter=draft-model,adaptive=1": {"qa": (100, 8.0), "rag": (100, 6.5)},
    "specwise:drafter=none": {"qa": (100, 3.0), "rag": (100, 3.0)},
}


def write_bench(out: Path, tasks=("qa", "rag"), timings=TIMINGS) -> None:
    """A `specwise bench run` folder written with the bench's own record and file writers."""
    out.mkdir(parents=True)
    base = SpecConfig()
    methods, records = [], []
    for name in timings:
        if name == BASELINE:
            method = SimpleNamespace(label=BASELINE, family="hf", weights="dense",
                                     description="Hugging Face generate() on the target alone")
        else:
            spec, model, _ = parse_specwise_method(name, base)
            method = SimpleNamespace(label=spec_label(spec, model, base), family="specwise", weights="dense",
                                     description=describe_spec(spec, model))
        methods.append({"label": method.label, "family": method.family, "description": method.description,
                        "name": name})
        for index, task in enumerate(tasks):
            tokens, seconds = timings[name][task]
            stats = None
            if method.family == "specwise":
                stats = SpecStats(steps=40, proposed=60, accepted=45, new_tokens=tokens,
                                  proposed_at=[20, 20, 10, 10], accepted_at=[18, 12, 8, 7])
            output = MethodOutput(list(range(tokens)), seconds, 40, stats)
            question = Question(index, task, ("Say hi.",))
            records.append(make_record(question, 0, method, 0, [1, 2, 3], output, "hi"))
    with (out / "records.jsonl").open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
    _write_json(out / "run.json", {"baseline": BASELINE, "target": DEFAULT_TARGET, "drafter_model": DEFAULT_DRAFTER,
                                   "tasks": list(tasks), "methods": methods})


def test_from_bench_picks_the_best_speedup(tmp_path):
    write_bench(tmp_path / "run")
    by_mean = best_from_bench([tmp_path / "run"])  # two tasks: the task mean by default
    assert by_mean.ranked_by == "task-mean" and by_mean.label == "specwise-ngram-k4"
    assert by_mean.speedup == pytest.approx(2 ** 0.5)
    assert "task mean" in by_mean.origin
    pooled = best_from_bench([tmp_path / "run"], "pooled")
    assert pooled.label.startswith("specwise-draft-model-adaptive")
    assert pooled.speedup == pytest.approx((200 / 14.5) / 10)
    assert pooled.draft_model == DEFAULT_DRAFTER and pooled.target == DEFAULT_TARGET
    assert pooled.mean_k == pytest.approx(3.0)  # 60 proposed over 20 drafting steps per record
    export = export_to("vllm", pooled)
    assert export.settings["num_speculative_tokens"] == 3 and "3.00" in notes_of(export)


def test_from_bench_merges_task_folders(tmp_path):
    write_bench(tmp_path / "qa", tasks=("qa",))
    write_bench(tmp_path / "rag", tasks=("rag",))
    merged = best_from_bench([tmp_path / "qa", tmp_path / "rag"])
    assert merged.ranked_by == "task-mean" and merged.label == "specwise-ngram-k4"
    only_qa = best_from_bench([tmp_path / "qa"])
    assert only_qa.ranked_by == "pooled" and only_qa.label == "specwise-ngram-k4"


def test_from_bench_errors(tmp_path):
    with pytest.raises(ExportError, match="records.jsonl"):
        best_from_bench([tmp_path])
    plain = {name: t for name, t in TIMINGS.items() if name in (BASELINE, "specwise:drafter=none")}
    write_bench(tmp_path / "plain", timings=plain)
    with pytest.raises(ExportError, match="no specwise method that drafts"):
        best_from_bench([tmp_path / "plain"])


def test_description_round_trip():
    for text in CONFIGS.values():
        spec, model, _ = parse_specwise_method(text, SpecConfig())
        back, back_model = spec_from_description(describe_spec(spec, model))
        assert back == spec and back_model == model
    shaped = SpecConfig(drafter="suffix", tree_shape=(3, 2, 1), draft_quantize=None)
    assert spec_from_description(describe_spec(shaped, None))[0] == shaped


# --------------------------------------------------------------------------- command line


def test_cli_prints_json(capsys):
    assert main(["export", "all", "--method", "specwise:drafter=draft-model,k=5", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [e["engine"] for e in data["exports"]] == list(ENGINES)
    assert data["exports"][0]["settings"]["num_speculative_tokens"] == 5
    # k = 5, or adaptive k in [1, 12] from 5, as each request samples (adaptive "auto")
    assert data["source"]["draft_model"] == DEFAULT_DRAFTER
    assert data["source"]["label"] == "specwise-draft-model-k5-auto1-12"


def test_cli_flags_and_text(capsys):
    assert main(["export", "sglang", "--drafter", "suffix", "--k", "16"]) == 0
    out = capsys.readouterr().out
    assert "--speculative-algorithm NGRAM" in out and "notes:" in out and "key list:" in out


def test_cli_from_bench_to_a_file(tmp_path, capsys):
    write_bench(tmp_path / "run")
    target = tmp_path / "export.json"
    assert main(["export", "vllm", "--from-bench", str(tmp_path / "run"), "--rank", "pooled", "--format", "json",
                 "--out", str(target)]) == 0
    data = json.loads(target.read_text(encoding="utf-8"))
    assert data["source"]["ranked_by"] == "pooled"
    assert data["exports"][0]["settings"]["method"] == "draft_model"


def test_cli_errors(tmp_path, capsys):
    assert main(["export", "vllm", "--drafter", "none"]) == 2
    assert "plain decoding" in capsys.readouterr().err
    assert main(["export", "vllm", "--from-bench", str(tmp_path)]) == 2
    assert "records.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "tgi"])
