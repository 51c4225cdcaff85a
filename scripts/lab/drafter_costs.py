"""Each specwise method's draft cost per token and its cost-model prediction beside the measurement.

Reads the records of `specwise bench run` folders (every task folder under ROOT, `all` left out)
and prints, per method: the draft seconds per draft token (in ms and in one-token passes T(1),
taken from plain decoding's own passes), the draft tokens and the committed tokens per step, and
the decoding speedup over plain decoding after the prompt, predicted by the cost model
(docs/DESIGN.md, "Cost model": τ · T(1) / (T(k + 1) + k · D), with the measured τ, mean k, draft
cost D and scoring pass T(k + 1)) and measured (new tokens per second, prompt reading left out).

    python scripts/lab/drafter_costs.py docs/results/bench-drafters-amx
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

PLAIN = "specwise-ar"


def totals(root: Path) -> dict[str, collections.Counter]:
    """Per method: draft seconds, draft tokens, steps, decoding pass seconds, new tokens, seconds after
    the prompt."""
    sums: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in sorted(root.glob("*/records.jsonl")):
        if path.parent.name == "all":
            continue
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["family"] != "specwise":
                continue
            prefill = record["prefill_seconds"] or 0
            total = sums[record["method"]]
            total["draft"] += record["draft_seconds"] or 0
            total["proposed"] += record["proposed"] or 0
            total["steps"] += record["steps"] or 0
            total["passes"] += (record["score_seconds"] or 0) - prefill  # the prompt's pass counts as scoring
            total["new"] += record["new_tokens"]
            total["after_prompt"] += record["wall_seconds"] - prefill
    return sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a folder of `specwise bench run` task folders")
    sums = totals(parser.parse_args().root)
    plain = next((m for m in sums if m == PLAIN or m.startswith(PLAIN + "-")), None)
    if plain is None:
        raise SystemExit(f"no plain decoding ({PLAIN}) among the methods: {', '.join(sums)}")
    t1 = sums[plain]["passes"] / sums[plain]["steps"]
    plain_rate = sums[plain]["new"] / sums[plain]["after_prompt"]
    print(f"T(1), plain decoding's mean pass: {1000 * t1:.1f} ms")
    print(f"{'method':55s} {'D ms':>7s} {'D/T(1)':>7s} {'k/step':>7s} {'tau':>5s} {'predicted':>9s} {'measured':>8s}")
    for method, s in sums.items():
        draft = s["draft"] / s["proposed"] if s["proposed"] else 0.0
        tau, k, one_pass = s["new"] / s["steps"], s["proposed"] / s["steps"], s["passes"] / s["steps"]
        predicted = tau * t1 / (one_pass + k * draft)
        measured = (s["new"] / s["after_prompt"]) / plain_rate
        print(f"{method:55s} {1000 * draft:7.2f} {draft / t1:7.3f} {k:7.2f} {tau:5.2f} {predicted:9.2f} {measured:8.2f}")


if __name__ == "__main__":
    main()
