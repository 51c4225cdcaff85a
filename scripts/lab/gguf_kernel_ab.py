"""Two builds of the GGUF kernel side by side in one process: the linear layers of a file's first layers,
each build's call alternated with the other's, so that the machine's swings in bandwidth hit both alike.

A build is the compiled module of a checkout (the .so under $SPECWISE_HOME/kernels that
`specwise.kernels.gguf.gguf_kernel_module().__file__` names when run from that checkout):

    .venv/bin/python scripts/lab/gguf_kernel_ab.py --gguf FILE.gguf \\
        --build before=/path/to/a.so --build after=/path/to/b.so --rows 1,8,16,64,256
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


def load(path: str) -> ModuleType:
    name = Path(path).name.split(".")[0]
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    import gguf

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--build", action="append", required=True, metavar="NAME=SO")
    parser.add_argument("--rows", default="1,2,4,8,16,64")
    parser.add_argument("--layers", type=int, default=6, help="the first N layers' linear weights")
    parser.add_argument("--path", default="avx512", help="kernel path (avx512, avx2, scalar)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    builds = {name: load(so) for name, so in (b.split("=", 1) for b in args.build)}
    weights = []
    for t in gguf.GGUFReader(args.gguf).tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) < args.layers and t.name.endswith(".weight") and len(t.shape) == 2:
            data = torch.from_numpy(t.data.reshape(-1).view("uint8").copy())
            weights.append((data, int(t.tensor_type), int(t.shape[1]), int(t.shape[0])))
    print(f"{args.gguf.name}: {len(weights)} weights of the first {args.layers} layers, {torch.get_num_threads()} threads")
    for n in (int(r) for r in args.rows.split(",")):
        xs = {i: torch.randn(n, i) for _, _, _, i in weights}
        times: dict[str, list[float]] = {name: [] for name in builds}
        for _ in range(args.repeats):
            for name, module in builds.items():
                start = time.perf_counter()
                for data, ggml_type, out_features, in_features in weights:
                    module.gguf_linear(xs[in_features], data, ggml_type, out_features, in_features, None, args.path)
                times[name].append(time.perf_counter() - start)
        print(f"n={n:4d}  " + "  ".join(f"{name} {1e3 * statistics.median(t[1:]):8.2f} ms" for name, t in times.items()),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
