"""Time one linear layer of the target's MLP shape for 1 to 16 rows, kernel by kernel, in one run.

Shows whether multi-token scoring is memory-bound (8 rows cost about one) or
compute-bound on this machine; docs/BENCHMARKS.md quotes its output.

    .venv/bin/python scripts/lab/linear_cost.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from specwise.kernels import kernel_status, linear, linear_int8


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--shape", default="8960x1536", help="OUTxIN of the layer")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out_features, in_features = map(int, args.shape.split("x"))
    torch.manual_seed(0)
    w32 = torch.randn(out_features, in_features)
    w16 = w32.bfloat16()
    scale = w32.abs().amax(dim=1) / 127
    w8 = torch.round(w32 / scale[:, None]).to(torch.int8)
    w_np = np.ascontiguousarray(w32.numpy().T)
    print(f"linear {out_features}x{in_features}, {args.threads} threads, median of {args.repeats} (ms); "
          f"specwise kernel: {kernel_status()}")
    print("| rows | torch bf16 | torch fp32 | NumPy fp32 | torch int8 weight-only | specwise bf16 | specwise int8 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for rows in (1, 2, 4, 8, 16):
        x32 = torch.randn(rows, in_features)
        x16, x_np = x32.bfloat16(), x32.numpy()
        cells = [
            median_ms(lambda: torch.nn.functional.linear(x16, w16), args.repeats),
            median_ms(lambda: torch.nn.functional.linear(x32, w32), args.repeats),
            median_ms(lambda: x_np @ w_np, args.repeats),
            median_ms(lambda: torch.ops.aten._weight_int8pack_mm(x16, w8, scale.bfloat16()), args.repeats),
            median_ms(lambda: linear(x16, w16), args.repeats),
            median_ms(lambda: linear_int8(x16, w8, scale.bfloat16()), args.repeats),
        ]
        print(f"| {rows} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
