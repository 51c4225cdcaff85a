"""The yardsticks at their best, and every published number traceable to its run.

- scripts/llamacpp_flags.sh builds llama.cpp native, and on a CPU with AMX without the AMX kernels
  (whose repacking crashes the pinned llama.cpp there) but with CPU_REPACK; nothing in the product
  turns repacking off at run time;
- the installed llama-cpp-python loads the default file with its default parameters, reports a
  CPU_REPACK buffer and evaluates a block of 8 tokens, in a child process (a crash fails the test);
- results record their provenance with paths relative to the repository or $SPECWISE_HOME;
- the README's and BENCHMARKS' results tables are what their files give, byte for byte.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specwise.bench import llamacpp, table
from specwise.bench.provenance import REPOSITORY, machine_class, portable, provenance
from specwise.cli import main

FLAGS = REPOSITORY / "scripts" / "llamacpp_flags.sh"
AMX_FLAGS = "fpu sse avx avx2 fma f16c bmi2 avx512f avx512bw avx512vbmi avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"


def build_args(tmp_path: Path, flags: str) -> str:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    return subprocess.run(["bash", str(FLAGS)], env=os.environ | {"CPUINFO": str(cpuinfo)}, check=True,
                          capture_output=True, text=True).stdout.split()


def test_llamacpp_is_built_native_where_that_works(tmp_path):
    args = build_args(tmp_path, "fpu sse avx avx2 fma f16c bmi2 avx512f avx512bw avx512_vnni")
    assert "-DGGML_NATIVE=ON" in args and not any("AMX" in a for a in args)
    assert "-DGGML_NATIVE=ON" in build_args(tmp_path, "fpu sse avx avx2 fma f16c")  # AVX2-only EPYCs


def test_llamacpp_on_an_amx_cpu_leaves_the_amx_kernels_out_and_keeps_its_features(tmp_path):
    args = build_args(tmp_path, AMX_FLAGS)
    assert "-DGGML_NATIVE=OFF" in args
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX512_VBMI=ON",
            "-DGGML_AVX2=ON"} <= set(args)
    assert not any("REPACK" in a for a in args)  # CPU_REPACK stays at its default: on


def test_nothing_turns_repacking_off_at_run_time():
    words = ("use_extra" + "_bufts", "no-" + "repack")
    hits = [f"{path.relative_to(REPOSITORY)}: {word}"
            for folder in ("specwise", "scripts") for path in (REPOSITORY / folder).rglob("*")
            if path.is_file() and path.suffix in (".py", ".sh", ".cpp", ".h")
            for word in words if word in path.read_text(encoding="utf-8", errors="replace")]
    assert hits == []


def test_load_log_gives_the_buffer_types():
    log = ("load_tensors: loading model tensors, this can take a while... (mmap = true)\n"
           "load_tensors:   CPU_Mapped model buffer size =  1059.89 MiB\n"
           "load_tensors:   CPU_REPACK model buffer size =   596.53 MiB\n")
    assert llamacpp.buffer_sizes(log) == {"CPU_Mapped": 1059.89, "CPU_REPACK": 596.53}
    described = llamacpp.describe({"version": "0.3.36", "build": {"cmake_args": "-DGGML_NATIVE=ON"},
                                   "buffers": llamacpp.buffer_sizes(log)})
    assert "0.3.36" in described and "-DGGML_NATIVE=ON" in described and "CPU_REPACK 597 MiB" in described


def test_a_build_with_amx_kernels_is_refused_on_an_amx_cpu(monkeypatch):
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: ("avx2", "avx512f", "amx_int8"))
    with pytest.raises(ValueError, match="install.sh --llamacpp"):
        llamacpp.check_build("CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    llamacpp.check_build("CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 |")  # the fair build passes
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: ("avx2", "avx512f"))
    llamacpp.check_build("CPU : AMX_INT8 = 1 |")  # no AMX on the CPU: its kernels never run


LOAD_AND_EVAL = """
import json, sys
import llama_cpp
from specwise.bench.llamacpp import open_llama
llm, yardstick = open_llama(sys.argv[1], n_ctx=64, n_threads=2, n_threads_batch=2, logits_all=True)
llm.eval(list(range(1000, 1008)))
scores = llm.scores[:8]
print(json.dumps({"tokens": llm.n_tokens, "finite": bool((abs(scores) < 1e4).all()),
                  "buffers": yardstick["buffers"], "system_info": yardstick["system_info"]}))
"""


@pytest.mark.real_models
def test_the_installed_llamacpp_runs_the_default_file_with_repacking_on():
    from specwise.store.catalog import DEFAULT_TARGET
    from specwise.errors import ModelError
    from specwise.store.prepare import gguf_file

    required = os.environ.get("SPECWISE_REQUIRE_REAL_MODELS") == "1"
    if not llamacpp.llamacpp_available() or not _gguf_ready(gguf_file, DEFAULT_TARGET, ModelError):
        if required:
            pytest.fail("llama-cpp-python and the default GGUF file are required here: "
                        "bash scripts/install.sh --test --llamacpp")
        pytest.skip("llama-cpp-python or the default GGUF file is missing (scripts/install.sh --llamacpp)")
    # A child process, so that a crash of llama.cpp (the pinned AMX kernels segfault) fails the test.
    done = subprocess.run([sys.executable, "-c", LOAD_AND_EVAL, str(gguf_file(DEFAULT_TARGET))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"llama.cpp died ({done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tokens"] == 8 and result["finite"]
    assert "REPACK = 1" in result["system_info"]
    assert result["buffers"].get("CPU_REPACK", 0) > 100, result["buffers"]  # Q4_K's interleaved copy


def _gguf_ready(gguf_file, name, error) -> bool:
    try:
        return gguf_file(name).is_file()
    except error:
        return False


def test_portable_paths(tmp_path):
    home = tmp_path / "home"
    prefixes = ((str(home), "$SPECWISE_HOME"), (str(REPOSITORY), "."))
    record = {"command": f"specwise bench run --target {home}/gguf/a.gguf --out {REPOSITORY}/results/x",
              "files": [f"{REPOSITORY}/docs/results/y", 3], "other": "/opt/model.gguf"}
    assert portable(record, prefixes) == {
        "command": "specwise bench run --target $SPECWISE_HOME/gguf/a.gguf --out results/x",
        "files": ["docs/results/y", 3], "other": "/opt/model.gguf"}


def test_provenance_names_the_commit_and_the_machine():
    record = provenance("specwise bench cost", bandwidth=False)
    code = record["specwise"]
    assert code["version"] and (code["commit"] is None or len(code["commit"]) == 40)
    assert record["machine"]["class"] == machine_class() and record["machine"]["cores"] >= 1
    assert record["command"] == "specwise bench cost" and record["yardsticks"] == []


def test_drafter_names_as_the_docs_write_them():
    assert table.drafter_name("specwise-suffix-k16-gguf") == "suffix k 16"
    assert table.drafter_name("specwise-ngram-adaptive1-12-gguf") == "adaptive n-gram"
    assert table.drafter_name("specwise-ngram-k4-gguf") == "n-gram k 4"
    assert table.drafter_name("specwise-draft-model-k4-gguf") == "draft model k 4"


def _run(folder: Path, task: str, rates: dict[str, float], provenance_record: dict | None) -> None:
    """A bench run folder: one question of `task`, each method's tokens/s as given."""
    folder.mkdir(parents=True)
    records = [{"method": m, "task": task, "question_id": 1, "new_tokens": 100, "wall_seconds": 100 / rate,
                "family": "llamacpp" if m.startswith("llamacpp") else "hf", "steps": None}
               for m, rate in rates.items()]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "run.json").write_text(json.dumps({"provenance": provenance_record} if provenance_record else {}))


def test_the_table_is_computed_from_the_files(tmp_path, capsys):
    record = {"specwise": {"commit": "abcdef0123" + "0" * 30, "dirty": False}, "date": "2026-12-05T10:00:00+00:00",
              "machine": {"class": "AMD EPYC Zen 4, AVX-512"}}
    rates = {"llamacpp-generate": 10.0, "specwise-ar-gguf": 12.0, "specwise-suffix-k16-gguf": 15.0,
             "specwise-ngram-adaptive1-12-gguf": 14.0, "specwise-ngram-k4-gguf": 13.0}
    _run(tmp_path / "new" / "qa", "qa", rates, record)
    _run(tmp_path / "new" / "rag", "rag", {m: r * 2 for m, r in rates.items()}, record)
    _run(tmp_path / "old", "qa", rates, None)
    (tmp_path / "cost.json").write_text(json.dumps({"results": [
        {"runner": "lean", "dtype": "gguf", "seconds": {"128": {"1": 0.04, "5": 0.06}}},
        {"runner": "llama.cpp", "dtype": "gguf", "seconds": {"128": {"1": 0.05, "5": 0.15}}}]}))
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"rows": [
        {"bench": "new", "cost": "cost.json"},
        {"bench": "old", "machine": "AMD EPYC Zen 2, AVX2 only", "date": "2026-11-01", "commit": "1234567",
         "note": "measured with older kernels"}]}))
    text = table.render(table.read_rows(rows), "readme")
    lines = text.splitlines()
    assert lines[2] == ("| AMD EPYC Zen 4, AVX-512 | 2026-12-05, abcdef0 | two tasks × 1 | 1.20 × | "
                        "suffix k 16: 1.50 ×; adaptive n-gram: 1.40 × | – | 1.50 vs 3.00 |")
    assert lines[3].startswith("| AMD EPYC Zen 2, AVX2 only¹ | 2026-11-01, 1234567 | one task × 1 |")
    assert lines[-1] == "¹ measured with older kernels"

    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n\n{table.START.format(name='readme')}\nold table\n{table.END}\n\nafter\n")
    assert main(["bench", "table", str(rows), "--check", str(readme)]) == 1  # stale: the check fails
    assert main(["bench", "table", str(rows), "--write", str(readme)]) == 0
    assert readme.read_text() == f"intro\n\n{table.START.format(name='readme')}\n{text}{table.END}\n\nafter\n"
    assert main(["bench", "table", str(rows), "--check", str(readme)]) == 0
    (tmp_path / "plain.md").write_text("no markers\n")
    capsys.readouterr()
    assert main(["bench", "table", str(rows), "--check", str(tmp_path / "plain.md")]) == 2
    assert "has no table markers" in capsys.readouterr().err
    old = json.loads(rows.read_text())
    del old["rows"][1]["commit"]
    rows.write_text(json.dumps(old))
    with pytest.raises(ValueError, match="must give commit"):
        table.read_rows(rows)


def test_published_tables_are_their_files():
    """README.md and docs/BENCHMARKS.md hold exactly what docs/results/headline.json's files give."""
    rows = REPOSITORY / "docs" / "results" / "headline.json"
    assert main(["bench", "table", str(rows), "--check", str(REPOSITORY / "README.md"),
                 str(REPOSITORY / "docs" / "BENCHMARKS.md")]) == 0


@pytest.mark.real_models
def test_ik_llamacpp_decodes_the_default_file_with_its_weights_repacked():
    from specwise.bench.ikllamacpp import IkLlamaCppMethod, ikllamacpp_available
    from specwise.config import SamplingParams
    from specwise.store.catalog import DEFAULT_TARGET
    from specwise.errors import ModelError
    from specwise.store.prepare import gguf_file

    if not ikllamacpp_available() or not _gguf_ready(gguf_file, DEFAULT_TARGET, ModelError):
        if os.environ.get("SPECWISE_REQUIRE_REAL_MODELS") == "1":
            pytest.fail("ik-llama-cpp-python and the default GGUF file are required here: "
                        "bash scripts/install.sh --test")
        pytest.skip("ik-llama-cpp-python or the default GGUF file is missing (scripts/install.sh --ikllamacpp)")
    method = IkLlamaCppMethod(DEFAULT_TARGET, eos_token_ids=[], threads=2, context=256)
    assert method.yardstick["repacked_tensors"] > 100 and "AVX2 build" in method.description
    output = method.generate(list(range(1000, 1020)), SamplingParams(max_new_tokens=6))
    assert len(output.token_ids) == 6 and all(0 <= t < 160000 for t in output.token_ids)
    again = method.generate(list(range(1000, 1020)), SamplingParams(max_new_tokens=6))
    assert again.token_ids == output.token_ids  # the cache is cleared between generations
    with pytest.raises(ValueError, match="greedily only"):
        method.generate([1000], SamplingParams(temperature=0.7, max_new_tokens=2))


def test_a_summary_names_no_absolute_path_of_the_repository():
    from specwise.bench.report import summary_markdown

    questions = REPOSITORY / "specwise" / "data" / "spec_bench_dev.jsonl"
    text = summary_markdown([], {"questions_file": str(questions), "command": f"specwise bench run --out {REPOSITORY}/x"})
    assert str(REPOSITORY) not in text and "prompts: specwise/data/spec_bench_dev.jsonl" in text


def test_a_run_resumes_though_its_record_holds_relative_paths():
    """run.json holds paths relative to the repository; the resumed run's settings give them absolute."""
    from specwise.bench.resume import check_same_run

    questions = REPOSITORY / "specwise" / "data" / "spec_bench_dev.jsonl"
    check_same_run({"questions_file": "specwise/data/spec_bench_dev.jsonl"}, {"questions_file": str(questions)})
    with pytest.raises(ValueError, match="questions_file"):
        check_same_run({"questions_file": "other.jsonl"}, {"questions_file": str(questions)})
