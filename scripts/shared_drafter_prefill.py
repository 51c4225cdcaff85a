"""How much drafter prefill a benchmark run's records skipped, by method.

Before `forget_prompts`, specwise configurations that shared one draft model
(same model and quantization: e.g. int8 k = 4, int8 adaptive, int8 trees) also shared its
cache, so on each prompt only the first of them in the rotated order read the prompt; the
others found it read. For every prompt and group of such methods this estimates what each
skipped as the group's largest prefill time minus its own, and prints it as a share of the
method's total wall time: the amount by which its tokens/s was flattered.

Runs made before the draft model read its prompt in `start()` timed that read as
drafting, where it cannot be told apart; for them `--per-token S` estimates instead: every
member of a group but the first in the prompt's order skipped S seconds per prompt token.

Usage: .venv/bin/python scripts/shared_drafter_prefill.py [--per-token S] RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from specwise.bench.methods import parse_specwise_method
from specwise.config import SpecConfig


def drafter_groups(run_dir: Path) -> dict[str, tuple]:
    """Label -> the settings that picked one shared drafter (as SpecDecoder.drafter_for keys it),
    for the run's draft-model methods, parsed from the method names in its run.json."""
    groups = {}
    for method in json.loads((run_dir / "run.json").read_text(encoding="utf-8"))["methods"]:
        if not method["name"].startswith("specwise:"):
            continue
        spec, model, _ = parse_specwise_method(method["name"], SpecConfig())
        if spec.drafter == "draft-model":
            groups[method["label"]] = (model, spec.runner, spec.draft_quantize, spec.draft_vocab)
    return groups


def main(run_dirs: list[str], per_token: float | None = None) -> None:
    for run_dir in run_dirs:
        records = [json.loads(line) for line in (Path(run_dir) / "records.jsonl").open(encoding="utf-8")]
        group_of = drafter_groups(Path(run_dir))
        prompts: dict[tuple, dict[str, list[dict]]] = collections.defaultdict(lambda: collections.defaultdict(list))
        for record in records:
            group = group_of.get(record["method"])
            if group is not None and (per_token is not None or record.get("prefill_seconds") is not None):
                prompts[record["question_id"], record["turn"]][group].append(record)
        skipped: collections.Counter = collections.Counter()
        wall: collections.Counter = collections.Counter()
        for groups in prompts.values():
            for members in groups.values():
                first = min(members, key=lambda r: r["order"])
                paid = max(r["prefill_seconds"] for r in members) if per_token is None else 0.0
                for r in members:
                    if per_token is None:
                        skipped[r["method"]] += paid - r["prefill_seconds"]
                    elif r is not first:
                        skipped[r["method"]] += per_token * r["prompt_tokens"]
                    wall[r["method"]] += r["wall_seconds"]
        print(f"{run_dir}:")
        for method in sorted(wall):
            print(f"  {method}: skipped {skipped[method]:.1f} s of drafter prefill over "
                  f"{wall[method]:.0f} s ({100 * skipped[method] / wall[method]:.1f} %)")


if __name__ == "__main__":
    args = sys.argv[1:]
    rate = None
    if args[:1] == ["--per-token"] and len(args) > 1:
        rate, args = float(args[1]), args[2:]
    if not args:
        sys.exit(__doc__)
    main(args, rate)
