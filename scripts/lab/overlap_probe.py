"""How much arithmetic a memory stream hides on this machine (overlap_probe.cpp).

Each thread streams its share of a buffer in 2304-byte blocks (a Q4_K group block of the interleaved
layout) and after each block runs R rounds of 8 independent vpdpbusd in registers. Timed three ways: the
stream alone (R = 0), the arithmetic alone (a small buffer in L2, read over and over: the same number of
blocks), and both; per software prefetch scheme (none; the next block into L1; 4 or 12 blocks ahead into
L2; both, as the tiles on Intel CPUs prefetch). "Exposed" is the share of the arithmetic's time that the
stream did not hide: (both - stream alone) / arithmetic alone. The GGUF tiles' own arithmetic per block
for n rows is what `interleave_ab.py` and `block_cost.py` measure; this says how much of it can be free.

    .venv/bin/python scripts/lab/overlap_probe.py [--threads 2] [--mb 450] [--rounds 0,8,16,24,32,48]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specwise.bench.provenance import machine_summary
from specwise.kernels import gguf as gk
from specwise.kernels.build import build_kernel

LAB = Path(__file__).resolve().parent
BLOCK = 2304
SCHEMES = {"none": (0, 4), "L1 next": (1, 4), "L2 +4": (2, 4), "both +4": (3, 4), "both +12": (3, 12)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--mb", type=int, default=450, help="bytes streamed, MB")
    parser.add_argument("--rounds", default="0,8,16,24,32,48", help="rounds of 8 vpdpbusd after each block")
    parser.add_argument("--repeats", type=int, default=3, help="best of")
    args = parser.parse_args()
    machine = machine_summary(bandwidth=False)
    if "avx512_vnni" not in machine["flags"]:
        raise SystemExit("this probe needs AVX-512 VNNI")
    probe = build_kernel(LAB / "overlap_probe.cpp", "overlap probe", ["-O2", "-fopenmp"])
    blocks = args.mb * 1_000_000 // BLOCK // args.threads * args.threads
    size = blocks * BLOCK
    buffer = gk.huge_page_buffer(size + 16 * BLOCK)
    buffer.fill_(1)
    small = 256 * BLOCK * args.threads  # 590 KB a thread: stays in L2
    repeats = max(1, size // small)
    print(f"{machine['cpu']} (family {machine['family']} model {machine['model']}); {args.threads} threads, {size / 1e6:.0f} MB streamed")
    print(f"{'vpdpbusd/block':>15} {'arithmetic':>11} " + " ".join(f"{name:>16}" for name in SCHEMES))
    alone: dict[str, float] = {}  # each scheme's stream with no arithmetic: the first row, whatever --rounds says
    for rounds in [0] + [r for r in (int(r) for r in args.rounds.split(",")) if r != 0]:
        cached = min(probe.stream(buffer, small, rounds, 0, 4, args.threads, repeats) for _ in range(args.repeats))
        cells = []
        for name, (prefetch, ahead) in SCHEMES.items():
            both = min(probe.stream(buffer, size, rounds, prefetch, ahead, args.threads, 1) for _ in range(args.repeats))
            if rounds == 0:
                alone[name] = both
            exposed = f" ({(both - alone[name]) / cached:4.0%})" if rounds else ""
            cells.append(f"{both * 1e3:7.1f} ms{exposed:>7}")
        print(f"{8 * rounds:>15} {cached * 1e3:8.1f} ms " + " ".join(f"{c:>16}" for c in cells))
    print("ms: best of the repeats; (share): the arithmetic's time not hidden by the stream")


if __name__ == "__main__":
    main()
