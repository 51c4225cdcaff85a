"""Two builds of the GGUF kernel side by side in one process: the linear layers of a file's first layers,
each build's call alternated with the other's, so that the machine's swings in bandwidth hit both alike.

A build is the compiled module of a checkout (the .so under $SPECWISE_HOME/kernels that
`specwise.kernels.gguf.gguf_kernel_module().__file__` names when run from that checkout):

    .venv/bin/python scripts/lab/gguf_kernel_ab.py --gguf FILE.gguf \\
        --build before=/path/to/a.so --build after=/path/to/b.so --rows 1,16,64,256   # --layers N: fewer
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_kernel_bench import load_weights, machine, memory_gbps  # noqa: E402  (the weights it times, the machine)


def load(path: str) -> ModuleType:
    name = Path(path).name.split(".")[0]
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--build", action="append", required=True, metavar="NAME=SO")
    parser.add_argument("--rows", default="1,2,4,8,16,64")
    parser.add_argument("--layers", type=int, default=None, help="only the first N layers (plus the output layer)")
    parser.add_argument("--path", default="avx512", help="kernel path (avx512, avx2, scalar)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    builds = {name: load(so) for name, so in (b.split("=", 1) for b in args.build)}
    weights = load_weights(args.gguf, args.layers)
    print(f"machine: {machine()}\nmemory: {memory_gbps(3):.1f} GB/s (sum over 1 GiB of float32, best of 3)")
    print(f"{args.gguf.name}: {len(weights)} linear weights, {sum(w.data.numel() for w in weights) / 1e9:.3f} GB")
    for n in (int(r) for r in args.rows.split(",")):
        xs = {w.in_features: torch.randn(n, w.in_features) for w in weights}
        times: dict[str, list[float]] = {name: [] for name in builds}
        for _ in range(args.repeats):
            for name, module in builds.items():
                start = time.perf_counter()
                for w in weights:
                    module.gguf_linear(xs[w.in_features], w.data, w.ggml_type, w.out_features, w.in_features, None,
                                       args.path)
                times[name].append(time.perf_counter() - start)
        print(f"n={n:4d}  " + "  ".join(f"{name} {1e3 * statistics.median(t[1:]):8.2f} ms" for name, t in times.items()),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
