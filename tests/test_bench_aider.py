"""scripts/bench_aider.py's parts that need neither aider nor a server: the tasks, setting one up, reading
the edited files, comparing them with the plain run's, the servers' metrics, the command lines and the table."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_aider", ROOT / "scripts" / "bench_aider.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_tasks_are_small_python_files_with_an_instruction(bench):
    tasks = bench.load_tasks()
    assert 6 <= len(tasks) <= 10 and len({t.name for t in tasks}) == len(tasks)
    for task in tasks:
        assert len(task.instruction) > 20 and task.files
        for name, text in task.files.items():
            assert name.endswith(".py") and 10 < len(text.splitlines()) < 100
            ast.parse(text, name)  # each file is Python that aider is to rewrite whole


def test_quick_takes_the_smallest_tasks(bench):
    tasks = bench.load_tasks()
    quick = bench.quick_tasks(tasks, 2)
    assert len(quick) == 2 and [t for t in tasks if t in quick] == quick  # in their usual order
    assert max(t.size for t in quick) <= min(t.size for t in tasks if t not in quick)
    assert max(tasks, key=lambda t: t.size) not in quick


def test_load_tasks_reads_a_directory_and_refuses_an_empty_one(bench, tmp_path):
    (tmp_path / "one" / "files").mkdir(parents=True)
    (tmp_path / "one" / "files" / "a.py").write_text("x = 1\n")
    (tmp_path / "one" / "task.json").write_text(json.dumps({"instruction": "rename x to y", "files": ["a.py"]}))
    (task,) = bench.load_tasks(tmp_path)
    assert (task.name, task.instruction, task.files) == ("one", "rename x to y", {"a.py": "x = 1\n"})
    with pytest.raises(SystemExit, match="no tasks in"):
        bench.load_tasks(tmp_path / "one" / "files")


def test_set_up_and_snapshot(bench, tmp_path):
    task = bench.Task("t", "do it", {"a.py": "a = 1\n", "b.py": "b = 2\n"})
    work = bench.set_up(task, tmp_path / "repo")
    assert bench.snapshot(work, ["a.py", "b.py"]) == task.files
    (work / "a.py").write_text("a = 10\n")
    (work / "b.py").unlink()
    assert bench.snapshot(work, ["a.py", "b.py"]) == {"a.py": "a = 10\n", "b.py": None}
    with pytest.raises(FileExistsError):  # a throwaway directory is always a fresh one
        bench.set_up(task, work)


def _record(bench, server: str, task: str, text: str, **fields):
    return bench.Record(server, task, wall_seconds=fields.pop("wall", 10.0), exit_code=fields.pop("exit_code", 0),
                        files={"a.py": text}, **fields)


def test_edits_are_compared_with_the_same_familys_plain_run(bench):
    records = [_record(bench, "specwise-plain", "t", "A"), _record(bench, "specwise-suffix", "t", "A"),
               _record(bench, "specwise", "t", "B"), _record(bench, "llama-server", "t", "B"),
               _record(bench, "llama-server-ngram", "t", "A"), _record(bench, "specwise-suffix", "u", "A")]
    bench.compare_to_plain(records)
    assert [r.same_as_plain for r in records] == [True, True, False, True, False, None]


SPECWISE_METRICS = """# HELP specwise_generated_tokens_total Tokens generated
specwise_generated_tokens_total{model="m"} 100.0
specwise_prompt_tokens_total{model="m"} 700.0
specwise_request_latency_seconds_sum{endpoint="chat"} 12.0
specwise_request_latency_seconds_sum{endpoint="completions"} 3.0
specwise_time_to_first_token_seconds_sum{endpoint="chat"} 5.0
specwise_spec_steps_total{drafter="suffix",model="m"} 40.0
specwise_spec_draft_tokens_accepted_total{drafter="suffix",model="m"} 60.0
specwise_requests_total{endpoint="/v1/models/{model}",status="200"} 2.0
"""
LLAMA_METRICS = """llamacpp:prompt_tokens_total 700
llamacpp:prompt_seconds_total 4.5
llamacpp:tokens_predicted_total 90
llamacpp:tokens_predicted_seconds_total 9
"""


def test_usage_is_read_from_the_servers_metrics(bench):
    sums = bench.parse_metrics(SPECWISE_METRICS)
    assert sums["specwise_request_latency_seconds_sum"] == 15.0 and sums["specwise_requests_total"] == 2.0
    assert bench.usage({}, sums, "specwise") == {"completion_tokens": 100, "prompt_tokens": 700,
                                                 "server_seconds": 15.0, "decode_seconds": 10.0, "steps": 40,
                                                 "accepted": 60}
    earlier = {"specwise_generated_tokens_total": 40.0, "specwise_spec_steps_total": 10.0}
    assert bench.usage(earlier, sums, "specwise")["completion_tokens"] == 60  # what grew, not what is
    assert bench.usage({}, bench.parse_metrics(LLAMA_METRICS), "llama-server") == {
        "completion_tokens": 90, "prompt_tokens": 700, "server_seconds": 13.5, "decode_seconds": 9.0, "steps": 0,
        "accepted": 0}


def test_the_table_and_the_overall_rows(bench):
    records = [_record(bench, "specwise-plain", "t", "A", completion_tokens=100, server_seconds=10.0,
                       decode_seconds=8.0, steps=100, accepted=0),
               _record(bench, "specwise-suffix", "t", "A", completion_tokens=100, server_seconds=4.0,
                       decode_seconds=2.0, steps=25, accepted=75, edited=True),
               _record(bench, "llama-server", "t", "B", completion_tokens=80, server_seconds=8.0, decode_seconds=6.0),
               _record(bench, "llama-server-ngram", "t", "C", completion_tokens=80, server_seconds=5.0,
                       decode_seconds=3.0, exit_code=1)]
    bench.compare_to_plain(records)
    assert records[1].tau == 4.0 and records[0].tau == 1.0 and records[2].tau is None
    total = bench.overall(records, "specwise-suffix")
    assert total["tokens_per_second"] == 25.0 and total["decode_tokens_per_second"] == 50.0
    assert total["tau"] == 4.0 and total["same_as_plain"] == "1/1" and total["failed"] == 0
    assert bench.overall(records, "llama-server-ngram")["same_as_plain"] == "0/1"
    text = bench.table(records, list(bench.SERVERS))
    rows = {line.split(" | ")[0].lstrip("| ") + "/" + line.split(" | ")[1]: line for line in text.splitlines()
            if line.startswith("| ") and " --- " not in line}
    assert "| 25.00 | 50.00 | 4.00 | yes | yes |" in rows["specwise-suffix/t"]
    assert "| 12.50 | 1.00 | no | yes |" in rows["specwise-plain/t"]
    assert "(aider exit 1)" in rows["llama-server-ngram/t (aider exit 1)"]
    assert "| 25.00 | 2.50 |" in rows["specwise-suffix/1"]  # 25 tokens/s against llama-server's 10
    assert "| 10.00 | 1.00 |" in rows["llama-server/1"] and "(1 failed)" in rows["llama-server-ngram/1 (1 failed)"]


def test_aider_runs_alone_greedy_and_offline(bench, tmp_path):
    task = bench.Task("t", "Rename x to y.", {"a.py": "x = 1\n", "b.py": "print(x)\n"})
    settings, metadata = bench.aider_files("/models/m.gguf", 8192, 777, tmp_path)
    (model,) = json.loads(settings.read_text())
    assert model == {"name": "openai//models/m.gguf", "edit_format": "whole", "use_repo_map": False,
                     "extra_params": {"max_tokens": 777}}
    assert json.loads(metadata.read_text())["openai//models/m.gguf"]["max_input_tokens"] == 8192
    command = bench.aider_command(Path("/venv/bin/aider"), "http://127.0.0.1:9", "/models/m.gguf", task, settings,
                                  metadata, tmp_path / "chat.md", 60)
    for flag in ("--no-git", "--yes-always", "--no-check-update", "--analytics-disable", "--no-auto-lint",
                 "--no-auto-test", "--no-detect-urls"):
        assert flag in command
    assert command[command.index("--edit-format") + 1] == "whole"
    assert command[command.index("--openai-api-base") + 1] == "http://127.0.0.1:9/v1"
    assert command[command.index("--message") + 1] == "Rename x to y." and command[-2:] == ["a.py", "b.py"]
    assert "--temperature" not in command  # aider's own default for a model: temperature 0
    environment = bench.aider_environment(tmp_path)
    assert environment["HOME"] == str(tmp_path) and environment["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert not any("KEY" in name or "TOKEN" in name for name in environment)


def test_each_server_is_started_as_server_compare_starts_it(bench, tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("")
    args = argparse.Namespace(gguf=Path("/models/t.gguf"), threads=2, specwise_args="--max-queue 4",
                              llama_server=str(binary), llama_args="", context=8192,
                              llama_ngram_args="--spec-type ngram-mod", draft_gguf=Path("/models/d.gguf"),
                              llama_draft_args="--spec-type draft-simple")
    compare = bench._server_compare()
    suffix = bench.server_command(compare, "specwise-suffix", args, 1234)
    assert suffix[1:3] == ["serve", "--port"] and "--drafter" in suffix
    assert suffix[suffix.index("--drafter") + 1] == "suffix" and "--max-queue" in suffix
    assert "--drafter" not in bench.server_command(compare, "specwise", args, 1234)  # the default drafter
    plain = bench.server_command(compare, "specwise-plain", args, 1234)
    assert plain[plain.index("--drafter") + 1] == "none"
    llama = bench.server_command(compare, "llama-server", args, 1234)
    assert llama[0] == str(binary) and "--metrics" in llama and "--spec-type" not in llama
    assert "ngram-mod" in bench.server_command(compare, "llama-server-ngram", args, 1234)
    draft = bench.server_command(compare, "llama-server-draft", args, 1234)
    assert draft[draft.index("-md") + 1] == "/models/d.gguf"
    assert args.specwise_args == "--max-queue 4" and args.llama_args == ""  # the caller's settings untouched
