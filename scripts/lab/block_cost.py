"""The GGUF kernel's arithmetic per 256-value block, with the weights in cache: where a pass's time goes.

Times `gguf_linear` on a few of the target's weights small enough to stay in the caches (the first
layer's attention projections and ffn_down), for 1, 2, 4, 8 and 16 activation rows, and prints ns per
block and core (best of --repeats calls; with --threads 1, cycles too at --ghz). Set beside the
memory floor (`scripts/lab/gguf_kernel_bench.py` prints it), it tells how much of T(1) is arithmetic.

    .venv/bin/python scripts/lab/block_cost.py --threads 1 --ghz 3.64
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

WEIGHTS = ("blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight")


def main() -> None:
    import gguf

    from specwise.kernels import gguf as gk
    from specwise.store.catalog import DEFAULT_TARGET
    from specwise.store.prepare import gguf_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="default: the default target's file")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--path", default=None, help="kernel path (default: the fastest this CPU runs)")
    parser.add_argument("--ghz", type=float, default=None, help="clock, to print cycles per block")
    parser.add_argument("--rows", default="1,2,4,8,16", help="activation row counts, comma-separated")
    args = parser.parse_args()
    args.gguf = args.gguf or gguf_file(DEFAULT_TARGET)
    torch.set_num_threads(args.threads)
    weights = {t.name: gk.GGUFWeight.from_reader_tensor(t) for t in gguf.GGUFReader(args.gguf).tensors
               if t.name in WEIGHTS}
    path = args.path or gk.kernel_path()
    print(f"kernel path {path}, {args.threads} thread(s)")
    for name, w in weights.items():
        blocks = w.out_features * w.in_features // 256
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, w.in_features)
            for _ in range(10):
                gk.gguf_linear(x, w, path=path)
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                gk.gguf_linear(x, w, path=path)
                best = min(best, time.perf_counter() - start)
            ns = best * 1e9 * args.threads / blocks
            cycles = f", {ns * args.ghz:5.1f} cycles" if args.ghz else ""
            print(f"{name:26s} {w.type_name} {w.nbytes / 1e6:5.2f} MB  rows {rows:<2}  {ns:5.2f} ns/block/core"
                  f"{cycles}  ({ns / rows:5.2f} a row)")


if __name__ == "__main__":
    main()
