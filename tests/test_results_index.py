"""docs/results stays indexed, cited correctly, free of machine paths and under its size budget.

No models and no torch: it reads files only (and asks git, where there is a checkout, whether the
commits the docs cite for removed results hold them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
INDEX = RESULTS / "README.md"
BUDGET_BYTES = 5_000_000  # `du -sb docs/results`

# A row of the index names one folder (`name/`) or top-level file (`name`) in its first cell.
INDEX_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|", re.MULTILINE)
# A cited path under docs/results: not part of a longer path and not `<commit>:docs/results/...`
# (a file in git history); it ends where a path character does not follow ({a,b}, *, <...> stop it).
CITED = re.compile(r"(?<![\w:/.$~-])docs/results/[A-Za-z0-9_./-]*")
# A markdown link target, up to an anchor or the closing parenthesis.
LINK = re.compile(r"\]\(([^)\s#]*)(?:#[^)\s]*)?\)")
# `git show <commit>:docs/results/...`: a removed result the docs still compare against.
HISTORY = re.compile(r"git show ([0-9a-f]{7,40}):(docs/results/[A-Za-z0-9_./-]+)")
# An absolute path of a machine: /root/, /home/, /tmp/, /work/, /Users/, not inside a longer path.
MACHINE_PATH = re.compile(rb"(?<![\w.~$/-])/(?:root|home|tmp|work|Users)/")
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf"}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), INDEX]


def index_names(text: str | None = None) -> list[str]:
    text = INDEX.read_text(encoding="utf-8") if text is None else text
    return [name.rstrip("/") for name in INDEX_ROW.findall(text) if name != "path"]


def entries() -> set[str]:
    return {p.name for p in RESULTS.iterdir() if p.name != "README.md"}


def index_problems(text: str | None = None) -> list[str]:
    names = index_names(text)
    listed = set(names)
    problems = [f"docs/results/{n} is not in docs/results/README.md" for n in sorted(entries() - listed)]
    problems += [f"docs/results/README.md lists {n}, which does not exist" for n in sorted(listed - entries())]
    problems += [f"docs/results/README.md lists {n} twice" for n in sorted({n for n in names if names.count(n) > 1})]
    return problems


def cited_paths(path: Path, text: str) -> list[tuple[str, Path]]:
    """(as written, where it points) for every docs/results path and relative link to results."""
    cited = []
    for match in CITED.finditer(text):
        written = match.group(0).rstrip(".,:;")
        cited.append((written, ROOT / written))
    for match in LINK.finditer(text):
        target = match.group(1)
        if not target or re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            continue  # an anchor, a URL
        if path == INDEX or target.startswith("results/") or path.parent == ROOT and target.startswith("docs/results/"):
            cited.append((target, path.parent / target))
    return cited


def citation_problems(files: list[Path] | None = None) -> list[str]:
    problems = []
    for path in files or doc_files():
        text = path.read_text(encoding="utf-8")
        for written, target in cited_paths(path, text):
            if not target.exists():
                problems.append(f"{path.relative_to(ROOT)} cites {written}, which does not exist")
    return problems


def size_of(folder: Path) -> int:
    """What `du -sb` counts: the apparent size of every file and folder, the folder itself included."""
    total = os.lstat(folder).st_size
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            total += os.lstat(os.path.join(base, name)).st_size
    return total


def machine_path_problems(folder: Path = RESULTS) -> list[str]:
    problems = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() not in BINARY_SUFFIXES):
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if MACHINE_PATH.search(line):
                problems.append(f"{os.path.relpath(path, ROOT)}:{number} names a machine's absolute path")
                break
    return problems


def test_every_result_is_indexed_and_every_index_entry_exists():
    assert index_names(), "docs/results/README.md has no table of result files"
    assert index_problems() == []


def test_docs_cite_only_result_files_that_exist():
    assert citation_problems() == []


def test_results_within_size_budget():
    size = size_of(RESULTS)
    assert size <= BUDGET_BYTES, (f"docs/results holds {size} bytes, over {BUDGET_BYTES}: remove superseded runs "
                                  "(docs/results/README.md, 'Adding a run')")


def test_no_machine_paths_in_results():
    assert machine_path_problems() == []


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_removed_results_cited_from_history_exist_there():
    missing = []
    for path in doc_files():
        for commit, cited in HISTORY.findall(path.read_text(encoding="utf-8")):
            spec = f"{commit}:{cited.rstrip('/.')}"
            found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", spec], capture_output=True)
            if found.returncode != 0:
                missing.append(f"{path.relative_to(ROOT)}: git show {spec} finds nothing")
    assert missing == []


# The checks themselves: each must fail on the fault it is there to catch.

def test_index_check_catches_missing_and_extra_entries():
    text = INDEX.read_text(encoding="utf-8")
    first = index_names(text)[0]
    without = re.sub(rf"^\|\s*`{re.escape(first)}/?`.*\n", "", text, count=1, flags=re.MULTILINE)
    assert any(first in p and "not in" in p for p in index_problems(without))
    extra = text + "\n| `no-such-run/` | m | w | c | s |\n"
    assert any("no-such-run" in p for p in index_problems(extra))


def test_citation_check_catches_a_missing_path(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("see `docs/results/no-such-run/summary.md` and [it](results/no-such-run/summary.md);\n"
                   "not `git show 0000000:docs/results/old/summary.md`, nor `--out results/bench-new`.\n",
                   encoding="utf-8")
    found = [written for written, target in cited_paths(DOCS / "x.md", doc.read_text()) if not target.exists()]
    assert found == ["docs/results/no-such-run/summary.md", "results/no-such-run/summary.md"]


def test_size_and_machine_path_checks_catch_their_faults(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text('{"questions_file": "/work/main/specwise/data/x.jsonl"}\n')
    (tmp_path / "run" / "ok.md").write_text("$SPECWISE_HOME/gguf/x.gguf, specwise/data/x.jsonl, docs/results/tmp/x\n")
    (tmp_path / "run" / "big.bin").write_bytes(b"\0" * 1000)
    assert size_of(tmp_path) >= 1000
    problems = machine_path_problems(tmp_path)
    assert len(problems) == 1 and "run.json" in problems[0]
