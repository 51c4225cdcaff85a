"""What a restricted draft vocabulary saves and what it can cost (README, docs/BENCHMARKS.md).

    .venv/bin/python scripts/lab/draft_vocab_cost.py --threads 2 \
        --records docs/results/bench-dev/*/records.jsonl

Saves: the draft model's seconds per draft token (one lean-runner pass over one new
token after a 128-token context, median of --repeats) with its whole output layer
and with the N most frequent tokens kept, bfloat16 and int8, side by side in one run.
Can cost: of the tokens the target generated in benchmark records (hf-generate's
greedy outputs), the share the restricted drafter could not have proposed (outside
the first N of the shipped list, the special tokens and the prompt's tokens).
Acceptance itself is measured by `specwise bench run` with `vocab=N`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specwise.drafters.vocab import find_token_list, kept_tokens
from specwise.store.catalog import DEFAULT_DRAFTER
from specwise.runners.lean import LeanRunner
from specwise.store.loading import load_model


def seconds_per_token(runner: LeanRunner, context: list[int], repeats: int) -> float:
    runner.reset()
    runner.forward(context, logits=False)
    samples = []
    for i in range(repeats + 2):  # two warm-up passes
        start = time.perf_counter()
        runner.forward([context[i % len(context)]])
        samples.append(time.perf_counter() - start)
        runner.rollback(1)
    return statistics.median(samples[2:])


def outside_share(records: list[Path], tokenizer, ordered: list[int], size: int, width: int) -> tuple[int, int]:
    """(generated tokens outside the kept set, generated tokens) over hf-generate's records."""
    from specwise.bench.prompts import DEFAULT_QUESTIONS, load_questions

    turns = {q.question_id: "\n".join(q.turns) for q in load_questions(DEFAULT_QUESTIONS)}
    base = set(kept_tokens(ordered, size, tokenizer.all_special_ids, width))
    outside = total = 0
    for path in records:
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.get("method") != "hf-generate":
                continue
            # Records keep no prompt: the question's turns stand for it (a second turn's prompt
            # also holds the first answer, so this undercounts what the drafter may propose).
            prompt = set(tokenizer(turns.get(record["question_id"], ""), add_special_tokens=False)["input_ids"])
            kept = base | prompt
            outside += sum(1 for t in record["token_ids"] if t not in kept)
            total += len(record["token_ids"])
    return outside, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", default=DEFAULT_DRAFTER)
    parser.add_argument("--sizes", default="65536,32768,16384,8192")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--records", nargs="*", type=Path, default=[])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    context = list(range(1000, 1128))
    rows = []
    for quantize in (None, "int8"):
        loaded = load_model(args.drafter, "bfloat16", quantize=quantize)
        ordered = find_token_list(loaded.tokenizer)
        runner = LeanRunner(loaded.model)
        width = runner.vocab_size
        full = seconds_per_token(runner, context, args.repeats)
        rows.append((quantize or "bfloat16", "all", width, full))
        for size in sizes:
            runner.restrict_output(kept_tokens(ordered, size, loaded.tokenizer.all_special_ids, width))
            rows.append((quantize or "bfloat16", str(size), len(runner.output_ids),
                         seconds_per_token(runner, context, args.repeats)))
            runner.restrict_output(None)
        del runner, loaded
    print(f"draft model {args.drafter}, lean runner, {torch.get_num_threads()} threads, context 128, "
          f"median of {args.repeats}")
    print("| weights | draft_vocab | tokens kept | ms per draft token | vs all tokens |")
    print("| --- | --- | --- | --- | --- |")
    for weights, size, kept, seconds in rows:
        reference = next(s for w, n, _, s in rows if w == weights and n == "all")
        print(f"| {weights} | {size} | {kept} | {1000 * seconds:.1f} | {seconds / reference:.2f} |")
    if args.records:
        loaded = load_model(args.drafter, "bfloat16")
        ordered = find_token_list(loaded.tokenizer)
        print("\n| draft_vocab | target tokens outside the kept set (hf-generate outputs) |")
        print("| --- | --- |")
        for size in sizes:
            outside, total = outside_share(args.records, loaded.tokenizer, ordered, size,
                                           loaded.model.get_output_embeddings().out_features)
            print(f"| {size} | {outside} of {total} ({outside / max(total, 1):.1%}) |")


if __name__ == "__main__":
    main()
