"""Is specwise's gguf target the model in the file? Greedy output against llama.cpp's, per task.

For each question (first turn, chat template unless --no-chat), both decode greedily from the same prompt ids:
specwise's plain decoding of the GGUF blocks as stored (the gguf format) and llama.cpp's own
(llama-cpp-python). Where they part, the gap between the top two logits of each at that
position is printed (from specwise's lean runner and from llama.cpp's logits), beside the largest
difference between the two logit vectors there: two different kernels (llama.cpp also rounds
the activations to 8 bits for its products) agree up to that deviation, so a first difference
should sit where the two candidates are closer than it. Writes one JSON
line per question to --out and a per-task summary to stdout.

    .venv/bin/python scripts/lab/llamacpp_agreement.py --questions-per-task 5 --max-new-tokens 128 \\
        --out results/llamacpp-agreement.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def top_two_gap(logits) -> float:
    top = torch.as_tensor(logits, dtype=torch.float64).topk(2).values
    return float(top[0] - top[1])


def main(argv: list[str] | None = None) -> int:
    from specwise import SamplingParams, SpecConfig, SpecDecoder
    from specwise.bench.llamacpp import describe, open_llama
    from specwise.bench.machine import cpu_flags, cpu_model
    from specwise.bench.prompts import DEFAULT_QUESTIONS, conversation, load_questions, select_questions
    from specwise.store.catalog import DEFAULT_TARGET
    from specwise.store.prepare import gguf_file

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    parser.add_argument("--questions-per-task", type=int, default=5)
    parser.add_argument("--tasks", default=None, help="comma-separated tasks (default: all six)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default=None, help="JSON lines, one per question")
    parser.add_argument("--no-chat", action="store_true",
                        help="the questions as plain text (a file without a chat template)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    decoder = SpecDecoder(args.target, SpecConfig(drafter="none", target_format="gguf"))
    eos = set(decoder.eos_token_ids)
    llm, yardstick = open_llama(str(gguf_file(args.target)), n_ctx=4096, n_threads=args.threads,
                                n_threads_batch=args.threads, logits_all=True)
    tasks = args.tasks.split(",") if args.tasks else None
    questions = select_questions(load_questions(args.questions), tasks, None, args.questions_per_task)
    print(f"{cpu_model()}, flags {' '.join(cpu_flags())}, {args.threads} threads; "
          f"{describe(yardstick)}", file=sys.stderr)
    sink = open(args.out, "w", encoding="utf-8") if args.out else None
    summary: dict[str, list[dict]] = {}
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
    runner = decoder.runner_for("lean", "gguf")
    for question in questions:
        ids = decoder.encode(conversation(question, 0, [], chat=not args.no_chat))
        ours = decoder.generate(ids, sampling).token_ids
        llm.reset()
        theirs: list[int] = []
        for token in llm.generate(ids, reset=True, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            theirs.append(int(token))
            if token in eos or len(theirs) >= args.max_new_tokens:
                break
        position = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        record = {"question_id": question.question_id, "task": question.task, "prompt_tokens": len(ids),
                  "compared": min(len(ours), len(theirs)), "first_difference": position}
        if position is not None:
            prefix = ids + ours[:position]
            runner.reset()
            runner.forward(prefix[:-1], logits=False)
            our_logits = runner.forward(prefix[-1:])[0]
            llm.reset()
            llm.eval(prefix)
            their_logits = llm.scores[len(prefix) - 1]
            their_logits = torch.as_tensor(their_logits, dtype=torch.float64)[: our_logits.shape[-1]]
            deviation = float((our_logits.double()[: their_logits.shape[-1]] - their_logits).abs().max())
            record.update(specwise_token=ours[position], llamacpp_token=theirs[position],
                          specwise_gap=top_two_gap(our_logits), llamacpp_gap=top_two_gap(their_logits),
                          logit_deviation=deviation)
        summary.setdefault(question.task, []).append(record)
        if sink:
            sink.write(json.dumps(record) + "\n")
            sink.flush()
        where = "identical" if position is None else (
            f"first difference at new token {position}: top-two gap {record['specwise_gap']:.3f} (specwise), "
            f"{record['llamacpp_gap']:.3f} (llama.cpp); largest logit difference {record['logit_deviation']:.3f}")
        print(f"{question.task} q{question.question_id}: {where}", file=sys.stderr)
    print("| task | questions | identical | first differences (new token: specwise gap / llama.cpp gap / "
          "largest logit difference) |")
    print("| --- | --- | --- | --- |")
    for task, records in summary.items():
        differ = [r for r in records if r["first_difference"] is not None]
        cells = ", ".join(f"{r['first_difference']}: {r['specwise_gap']:.3f} / {r['llamacpp_gap']:.3f} / "
                          f"{r['logit_deviation']:.3f}"
                          for r in differ) or "none"
        print(f"| {task} | {len(records)} | {len(records) - len(differ)} | {cells} |")
    if sink:
        sink.close()
        print(f"wrote {Path(args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
