"""Stored against interleaved weights of a GGUF model, alternated in one process.

Every linear weight of the chosen block types is held twice, as stored and (a copy) in the interleaved
layout of the types named by --interleave; for each row count the two sets are timed one after the other,
in alternating order from round to round, so that the swings of a machine's memory bandwidth fall on both.
Prints the best time of each (ms, every weight once) and their ratio (interleaved / stored).

    python scripts/lab/interleave_ab.py [--gguf FILE] [--types Q4_K,Q6_K] [--interleave Q4_K] [--rounds 7]

--random TYPE times valid random blocks of TYPE in the shapes of the file's first --layers layers instead
(for a type no file at hand holds). Both sides run on the kernel's path (SPECWISE_GGUF_KERNEL=avx2 times
the AVX2 tiles of the layout). --paths A,B instead times the interleaved weights on two kernel paths, such
as amx,avx512: the AMX tiles of the layout against its AVX-512 tiles, where the amx path takes a call.

    python scripts/lab/interleave_ab.py --gguf FILE --types Q8_0 --interleave Q8_0 --paths amx,avx512 --rows 8,12,16,32
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from gguf_kernel_bench import load_weights

from specwise.kernels import gguf as gk
from specwise.store.catalog import DEFAULT_TARGET
from specwise.store.prepare import gguf_file

ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def random_weight(type_name: str, shape: tuple[int, int], seed: int) -> gk.GGUFWeight:
    """Valid random blocks of a type in a weight's shape, in memory as the loader keeps weights."""
    import gguf
    import numpy as np

    from specwise.testing import random_gguf_blocks

    blocks = torch.from_numpy(random_gguf_blocks(type_name, *shape, np.random.default_rng(seed)))
    data = gk.huge_page_buffer(blocks.numel()).view(blocks.shape)
    data.copy_(blocks)
    return gk.GGUFWeight(data, int(gguf.GGMLQuantizationType[type_name]), shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="default: the default target's file")
    parser.add_argument("--types", default="Q4_K,Q6_K", help="block types timed (the others are left out)")
    parser.add_argument("--interleave", default="Q4_K", help="block types interleaved on the second side")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    parser.add_argument("--random", default=None, metavar="TYPE", help="random blocks of TYPE in the file's shapes")
    parser.add_argument("--layers", type=int, default=4, help="with --random: the first N layers' shapes")
    parser.add_argument("--paths", default=None, help="A,B: the interleaved weights on kernel paths A and B")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    types, laid = set(args.types.split(",")), set(args.interleave.split(","))
    path = args.gguf or gguf_file(DEFAULT_TARGET)
    if args.random:
        shapes = [w.shape for w in load_weights(path, args.layers)]
        output_rows = max(rows for rows, _ in shapes)  # the output layer's vocabulary: left out
        stored = [random_weight(args.random, shape, seed) for seed, shape in enumerate(shapes) if shape[0] != output_rows]
        types = laid = {args.random}
    else:
        stored = [w for w in load_weights(path, None) if w.type_name in types]
    other = []
    for w in stored:
        data = gk.huge_page_buffer(w.nbytes).view(w.data.shape)
        data.copy_(w.data)
        copy = gk.GGUFWeight(data, w.ggml_type, w.shape)
        other.append(gk.interleave(copy) if w.type_name in laid and w.out_features % gk.GROUP_ROWS == 0 else copy)
    print(f"{len(stored)} weights ({', '.join(sorted(types))}), {sum(w.nbytes for w in stored) / 1e9:.3f} GB, "
          f"{sum(w.interleaved for w in other)} interleaved on the second side; {torch.get_num_threads()} threads")
    rows = [int(n) for n in args.rows.split(",")]
    inputs = {n: [torch.randn(n, w.in_features) for w in stored] for n in rows}
    # (name, weights, kernel path: None for the CPU's own)
    sides = [("stored", stored, None), ("interleaved", other, None)]
    if args.paths:
        sides = [(p, other, p) for p in args.paths.split(",")]
    best: dict[tuple[str, int], float] = {}
    for r in range(args.rounds):
        for n in rows:
            for name, weights, kernel in sides if r % 2 == 0 else sides[::-1]:
                start = time.perf_counter()
                for x, w in zip(inputs[n], weights):
                    gk.gguf_linear(x, w, path=kernel)
                elapsed = time.perf_counter() - start
                best[name, n] = min(best.get((name, n), elapsed), elapsed)
        print(f"round {r + 1} of {args.rounds}", flush=True)
    (first, *_), (second, *_) = sides
    print("n".ljust(12) + "".join(f"{n:>8}" for n in rows))
    for name in (first, second):
        print(name.ljust(12) + "".join(f"{best[name, n] * 1e3:8.1f}" for n in rows))
    print("ratio".ljust(12) + "".join(f"{best[second, n] / best[first, n]:8.2f}" for n in rows))


if __name__ == "__main__":
    main()
