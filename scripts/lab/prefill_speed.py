"""How fast each way of running the target reads a long prompt (prefill), side by side in one run.

Reads the same prompt (default: 700 tokens of the first rag question of the shipped Spec-Bench
split, through the chat template) with: specwise's lean runner on the dense model and on the
GGUF blocks as stored, the Hugging Face forward of the dense model, and llama.cpp on the same
GGUF file (when llama-cpp-python is installed). Median of --repeats readings each, in
interleaved order; prints tokens/s and the machine.

    .venv/bin/python scripts/lab/prefill_speed.py --tokens 700 --repeats 3
    .venv/bin/python scripts/lab/prefill_speed.py --readers gguf,llamacpp   # leave the slow ones out

`gguf-batched` times the reading the gguf format no longer uses: the PyTorch layers with one
batched attention call (and bfloat16 products on native-bfloat16 CPUs), faster on some CPUs but
not row-independent, so a prompt's entries would depend on its chunking (docs/DESIGN.md, "Numerics").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    from specwise import SpecConfig, SpecDecoder
    from specwise.bench.llamacpp import describe, llamacpp_available, open_llama
    from specwise.bench.provenance import provenance
    from specwise.bench.machine import cpu_flags, cpu_model, memory_bandwidth
    from specwise.bench.prompts import DEFAULT_QUESTIONS, conversation, load_questions, select_questions
    from specwise.store.catalog import DEFAULT_TARGET
    from specwise.store.prepare import gguf_file

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--tokens", type=int, default=700)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default=None, help="also write the readings with their provenance to this "
                        "JSON file (what `specwise bench table` reads)")
    parser.add_argument("--readers", default="gguf,dense,hf,llamacpp",
                        help="which to time, of gguf, gguf-batched, dense (lean runner), hf, llamacpp; on a CPU "
                             "without native bfloat16 the dense readers take minutes a prompt")
    args = parser.parse_args(argv)
    wanted = set(args.readers.split(","))
    known = {"gguf", "gguf-batched", "dense", "hf", "llamacpp"}
    if not wanted <= known:
        parser.error(f"--readers: unknown {', '.join(sorted(wanted - known))}; choose from {', '.join(sorted(known))}")
    torch.set_num_threads(args.threads)

    decoder = SpecDecoder(args.target, SpecConfig(drafter="none", target_format="gguf"), dtype=args.dtype,
                          prefix_cache_bytes=0)  # every reading from scratch
    rag = select_questions(load_questions(DEFAULT_QUESTIONS), ["rag"], None, 1)[0]
    ids = decoder.encode(conversation(rag, 0, [], chat=True))
    while len(ids) < args.tokens:
        ids = ids + ids
    ids = ids[:args.tokens]


    def specwise_reader(runner):
        def read() -> None:
            runner.reset()
            runner.forward(ids, logits=False)  # what the engine's prefill does
        return read

    def batched_reader(runner):
        from specwise.runners.passes import Attention, Implementation, Pass, PassKind

        batched = Pass(PassKind.PREFILL, Implementation.LAYERS, Attention.BATCHED, bf16_prefill=True)

        def read() -> None:
            runner.reset()
            runner._execute(batched, ids, runner.layout(ids), False, None)
        return read

    readers = {}
    yardsticks = []
    if "gguf" in wanted:
        readers["specwise lean, gguf blocks"] = specwise_reader(decoder.runner_for("lean", "gguf"))
    if "gguf-batched" in wanted:
        readers["specwise lean, gguf blocks, batched attention"] = batched_reader(decoder.runner_for("lean", "gguf"))
    if "dense" in wanted:
        readers[f"specwise lean, dense {args.dtype}"] = specwise_reader(decoder.runner_for("lean", "dense"))
    if "hf" in wanted:
        hf_model = decoder.target_model("dense").model

        def hf_read() -> None:
            with torch.inference_mode():
                hf_model.model(torch.tensor([ids]))  # the decoder stack; no output layer, like prefill

        readers[f"Hugging Face forward, dense {args.dtype}"] = hf_read
    if "llamacpp" in wanted and llamacpp_available():
        llm, yardstick = open_llama(str(gguf_file(args.target)), n_ctx=args.tokens + 16, n_batch=512,
                                    n_threads=args.threads, n_threads_batch=args.threads)
        yardsticks.append(yardstick)

        def llama_read() -> None:
            llm.reset()
            llm.eval(ids)

        print(describe(yardstick), file=sys.stderr)
        readers["llama.cpp, gguf blocks"] = llama_read
    elif "llamacpp" in wanted:
        print("llama-cpp-python is not installed: llama.cpp left out (scripts/install.sh --llamacpp)",
              file=sys.stderr)
    for name, read in readers.items():  # warm-up: kernels built, caches allocated
        print(f"warming up: {name}", file=sys.stderr, flush=True)
        read()
    samples: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(args.repeats):
        for name, read in readers.items():
            start = time.perf_counter()
            read()
            samples[name].append(time.perf_counter() - start)
            print(f"{name}: {samples[name][-1]:.2f} s", file=sys.stderr, flush=True)
    print(f"{cpu_model()}, {args.threads} threads, flags {' '.join(cpu_flags())}, "
          f"read bandwidth {memory_bandwidth():.1f} GB/s; prompt of {len(ids)} tokens, median of {args.repeats}")
    print("| reader | seconds | tokens/s |")
    print("| --- | --- | --- |")
    for name, times in samples.items():
        seconds = statistics.median(times)
        print(f"| {name} | {seconds:.2f} | {len(ids) / seconds:.0f} |")
    if args.out:
        record = {"provenance": provenance(" ".join(["python scripts/lab/prefill_speed.py", *(argv or sys.argv[1:])]),
                                           yardsticks),
                  "target": args.target, "prompt_tokens": len(ids), "threads": args.threads, "repeats": args.repeats,
                  "readers": {name: {"seconds": times, "median_seconds": statistics.median(times),
                                     "tokens_per_second": len(ids) / statistics.median(times)}
                              for name, times in samples.items()}}
        from specwise.bench.provenance import portable

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(portable(record), indent=1), encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
