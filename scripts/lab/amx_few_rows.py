"""AMX tiles for 1-8 rows of Q4_K: faster than the AVX-512 tiles in cache, slower from memory.

An experiment specwise does not ship (docs/BENCHMARKS.md, "AMX tiles for few rows"). This builds the
kernel module from a copy of specwise/kernels with scripts/lab/amx_few_rows.cpp added, whose tiles take
1-8 rows of Q4_K and Q5_K on the amx path; checks them bit for bit against the AVX-512 tiles on the
default target's weights; and times both, per block with the weights in cache (attn_q of the first layer,
one thread) and with every Q4_K weight of the layers read from memory once per round. Needs a CPU with
AMX-INT8. The variants (layout, prefetching, parts skipped) are environment settings: see the .cpp file.
With SPECWISE_FEW_ROWS_LAYOUT=repacked the AMX tiles read copies of the weights repacked here (`repack`).

    .venv/bin/python scripts/lab/amx_few_rows.py [--threads 1,2] [--rows 1,5,8]
    SPECWISE_FEW_ROWS_LAYOUT=repacked SPECWISE_FEW_ROWS_PREFETCH=rows .venv/bin/python scripts/lab/amx_few_rows.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

LAB = Path(__file__).resolve().parent
KERNELS = LAB.parent.parent / "specwise" / "kernels"
DISPATCH = "  if (path == kAmx && amx::takes(type, nrows)) return"


def build(folder: Path):
    """The kernel module with the few-row tiles, built from a copy of the sources in `folder`."""
    from specwise.kernels import gguf as gk
    from specwise.kernels.build import build_kernel

    for source in [*KERNELS.glob("*.cpp"), *KERNELS.glob("*.h")]:
        shutil.copy(source, folder / source.name)
    shutil.copy(LAB / "amx_few_rows.cpp", folder / "amx_few_rows.cpp")
    paths = (folder / "gguf_paths.h").read_text()
    declared = """bool thin_takes(int64_t type, int64_t nrows);
void thin_rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
               const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy);
}  // namespace amx"""
    assert paths.count("}  // namespace amx") == 1, "gguf_paths.h changed: update this script"
    (folder / "gguf_paths.h").write_text(paths.replace("}  // namespace amx", declared))
    linear = (folder / "gguf_linear.cpp").read_text()
    assert linear.count(DISPATCH) == 1, "gguf_linear.cpp's dispatch changed: update this script"
    few = ("  if (path == kAmx && amx::thin_takes(type, nrows))\n"
           "    return amx::thin_rows(type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);\n")
    (folder / "gguf_linear.cpp").write_text(linear.replace(DISPATCH, few + DISPATCH))
    extra = tuple(folder / p.name for p in gk._EXTRA_SOURCES) + (folder / "amx_few_rows.cpp",)
    return build_kernel(folder / "gguf_linear.cpp", "GGUF kernel with AMX few-row tiles",
                        ["-O3", "-ffp-contract=off", "-fopenmp", "-DSPECWISE_FAR_PREFETCH"], extra_sources=extra)


def repack(data: torch.Tensor, out_features: int, in_features: int, block_bytes: int) -> torch.Tensor:
    """Rows in groups of 16, each block's dword d of the group's 16 rows side by side (the .cpp's layout)."""
    import numpy as np

    nb = in_features // 256
    raw = data.reshape(out_features, nb * block_bytes).contiguous().numpy().view(np.uint32)
    grouped = raw.reshape(out_features // 16, 16, nb, block_bytes // 4).transpose(0, 2, 3, 1)
    return torch.from_numpy(np.ascontiguousarray(grouped)).view(torch.uint8).reshape(data.shape)


def main() -> None:
    import gguf

    from specwise.kernels import gguf as gk
    from specwise.store.catalog import DEFAULT_TARGET
    from specwise.store.prepare import gguf_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="thread counts for the reading from memory")
    parser.add_argument("--rows", default="1,2,3,4,5,8")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if "amx" not in gk.available_paths():
        raise SystemExit("this CPU (or its operating system) offers no AMX-INT8")
    rows = [int(r) for r in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        module = build(Path(folder))
    weights = [gk.GGUFWeight.from_reader_tensor(t) for t in gguf.GGUFReader(gguf_file(DEFAULT_TARGET)).tensors
               if t.name.startswith("blk.") and t.tensor_type.name == "Q4_K"]

    layout = os.environ.get("SPECWISE_FEW_ROWS_LAYOUT", "stored")
    skip = os.environ.get("SPECWISE_FEW_ROWS_SKIP", "none")
    if layout == "repacked":
        assert all(w.out_features % 16 == 0 for w in weights), "the repacked layout takes whole groups of 16 rows"
    amx_data = {id(w): repack(w.data, w.out_features, w.in_features, 144) if layout == "repacked" else w.data
                for w in weights}

    def run(x, w, path):
        data = amx_data[id(w)] if path == "amx" else w.data
        return module.gguf_linear(x, data, w.ggml_type, w.out_features, w.in_features, None, path)

    torch.manual_seed(0)
    print(f"layout: {layout}; prefetch: {os.environ.get('SPECWISE_FEW_ROWS_PREFETCH', 'none')}; skipped: {skip}")
    if skip == "none":
        for w in weights[:8]:  # bit for bit against the AVX-512 tiles
            for n in range(1, 9):
                x = torch.randn(n, w.in_features)
                assert torch.equal(run(x, w, "amx"), run(x, w, "avx512")), (n, w.out_features, w.in_features)
        print("identical to the AVX-512 tiles: 8 weights x 1-8 rows")

    torch.set_num_threads(1)
    attn_q = next(w for w in weights if w.out_features == w.in_features)  # blk.0.attn_q
    blocks = attn_q.out_features * attn_q.in_features // 256
    print("in cache (attn_q, 1 thread), ns a block:")
    for path in ("avx512", "amx"):
        cells = []
        for n in rows:
            x = torch.randn(n, attn_q.in_features)
            best = float("inf")
            for _ in range(200):
                start = time.perf_counter()
                run(x, attn_q, path)
                best = min(best, time.perf_counter() - start)
            cells.append(f"{n} rows {best * 1e9 / blocks:5.2f}")
        print(f"  {path:7s}", " | ".join(cells))

    total = sum(w.nbytes for w in weights)
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        print(f"from memory: {len(weights)} Q4_K weights ({total / 1e6:.0f} MB), {threads} thread(s), ms (best of "
              f"{args.repeats}):")
        for path in ("avx512", "amx"):
            cells = []
            for n in rows:
                xs = {w.in_features: torch.randn(n, w.in_features) for w in weights}
                best = float("inf")
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    for w in weights:
                        run(xs[w.in_features], w, path)
                    best = min(best, time.perf_counter() - start)
                cells.append(f"{n} rows {best * 1e3:6.1f}")
            print(f"  {path:7s}", " | ".join(cells))


if __name__ == "__main__":
    main()
