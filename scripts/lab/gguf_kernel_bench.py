"""Time the GGUF linear kernel on a GGUF model's linear weights against bfloat16 matmuls of the same weights.

For n = 1, 2, 3, 4, 5, 8, 16, 32 rows, the time of one call on every linear weight of the model (all layers
and the output layer: the matmul part of a forward pass, T(n)), per kernel path, with the weight bytes
read and the effective bandwidth; then PyTorch's bfloat16 F.linear and specwise's bfloat16 kernel on the
dequantized weights. A large sum measures the memory floor. Over --repeats: the median and minimum wall clock
(on a shared machine a thread that loses its core stalls every parallel region: the minimum is the
estimate for an idle machine), and the median CPU time per thread.

--floor adds the rate of 16 independent chains of the instruction each path multiplies with
(scripts/lab/product_peak.cpp: vpdpbusd on 512 bits for avx512, vpmaddubsw + vpmaddwd + vpaddd on 256
bits for avx2), the CPU's peak for the products, and for each n the time the model's products alone would
take at that rate, beside the path's measured T(1). --interleaved times the weights in the interleaved
layout (the types that have it, or those named).

    python scripts/lab/gguf_kernel_bench.py [--gguf FILE] [--layers N] [--repeats 5] [--threads N]
                                        [--paths avx512,avx2,scalar] [--no-bf16] [--floor] [--interleaved]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specwise.kernels import gguf as gk
from specwise.kernels import linear as bf16_kernel_linear
from specwise.store.catalog import DEFAULT_TARGET
from specwise.store.prepare import gguf_file

ROWS = (1, 2, 3, 4, 5, 8, 16, 32)
LAB = Path(__file__).resolve().parent
# The instruction each path multiplies 8-bit codes with (product_peak.cpp), and the CPU flag it needs.
PRODUCTS = {"avx512": ("vnni512", "avx512_vnni"), "avx2": ("maddubs256", "avx2")}
LINEAR = re.compile(r"blk\.(\d+)\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight|output\.weight")


def machine() -> str:
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s*(.+)", info)
    flags = set(re.search(r"Flags:\s*(.+)", info).group(1).split()) if "Flags:" in info else set()
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"]
    return (f"{model.group(1).strip() if model else 'unknown CPU'}, {torch.get_num_threads()} threads, "
            f"flags: {' '.join(f for f in wanted if f in flags)}")


def timed_ms(fn, repeats: int) -> tuple[float, float, float]:
    """Over `repeats` runs (after a warm-up) of fn(): median and minimum wall-clock ms, median process CPU ms per thread.

    On a machine shared with other work the wall clock counts the time this process waits for a core; the
    CPU time does not, so CPU ms per thread estimates the wall time on an idle machine (for one thread,
    closely; for several, it also counts threads waiting at the end of a parallel region).
    """
    fn()  # warm: page in, build, caches
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return 1000 * statistics.median(wall), 1000 * min(wall), 1000 * statistics.median(cpu) / torch.get_num_threads()


def memory_gbps(repeats: int) -> float:
    big = gk.huge_page_buffer(1 << 30).view(torch.float32).fill_(1.0)  # 1 GiB, on huge pages as the weights are
    _, best, _ = timed_ms(lambda: big.sum(), repeats)
    return big.numel() * 4 / best / 1e6


def load_weights(path: Path, layers: int | None) -> list[gk.GGUFWeight]:
    import gguf

    weights = []
    for tensor in gguf.GGUFReader(path).tensors:
        match = LINEAR.fullmatch(tensor.name)
        if match and (layers is None or match.group(1) is None or int(match.group(1)) < layers):
            mapped = gk.GGUFWeight.from_reader_tensor(tensor, copy=False)
            data = gk.huge_page_buffer(mapped.nbytes).view(mapped.data.shape)  # where the runner keeps weights
            data.copy_(mapped.data)
            weights.append(gk.GGUFWeight(data, mapped.ggml_type, mapped.shape))
    return weights


def product_rates(probe, kind: str, threads: int) -> float:
    """Products a second of one multiply instruction on `threads` threads (best of 3 runs of about half a second)."""
    iters = max(1, int(0.5 * probe.rate(kind, 100_000, threads) / (16 * 64 * threads)))
    return max(probe.rate(kind, iters, threads) for _ in range(3))


def report_floor(macs: int, threads: int, t1: dict[str, float]) -> None:
    """Each path's multiply rate on one thread and on `threads` (for avx512 also with the activation in a
    register, not broadcast from memory), and the products' own time at the latter for each n."""
    from specwise.kernels.build import build_kernel
    from specwise.kernels.cpu import cpuinfo_field

    probe = build_kernel(LAB / "product_peak.cpp", "product peak probe", ["-O2", "-fopenmp"])
    flags = set((cpuinfo_field("flags") or "").split())
    for path, (kind, flag) in PRODUCTS.items():
        if flag not in flags:
            continue
        rate = product_rates(probe, kind, threads)
        others = [(kind, 1)] + ([("vnni512reg", 1), ("vnni512reg", threads)] if kind == "vnni512" else [])
        shown = ", ".join(f"{name} on {n}: {product_rates(probe, name, n) / 1e9:.0f}" for name, n in others)
        floors = "  ".join(f"n={n} {n * macs / rate * 1e3:.1f} ms" + (f" ({n * macs / rate * 1e3 / t1[path]:.2f} T(1))"
                                                                      if path in t1 else "") for n in ROWS)
        print(f"{'floor ' + path:>14} {kind}: {rate / 1e9:.0f} G products/s on {threads} threads ({shown}); "
              f"the products alone: {floors}")


def report(label: str, weight_bytes: int, times: dict[int, tuple[float, float, float]]) -> None:
    wall1, best1, _ = times[min(times)]
    for n, (wall, best, cpu) in times.items():
        print(f"{label:>14} n={n:<3} wall median {wall:7.1f} ms {wall / wall1:5.2f}x | min {best:7.1f} ms "
              f"{best / best1:5.2f}x {weight_bytes / best / 1e6:5.1f} GB/s | cpu/thread {cpu:7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="default: the default target's file")
    parser.add_argument("--layers", type=int, default=None, help="only the first N layers (plus the output layer)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--paths", default=",".join(gk.PATHS), help="kernel paths to time (those the CPU can run)")
    parser.add_argument("--scalar-rows", type=int, default=2, help="largest n timed on the (slow) scalar path")
    parser.add_argument("--no-bf16", action="store_true", help="skip the bfloat16 comparisons")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    parser.add_argument("--floor", action="store_true", help="the products alone at the rate of 16 chains of the multiply instruction")
    parser.add_argument("--interleaved", nargs="?", const="all", default=None, metavar="TYPES",
                        help="weights in the interleaved layout where their type has one (avx512 path); "
                             "TYPES (e.g. Q4_K,Q5_K) limits it to those block types")
    args = parser.parse_args()
    args.gguf = args.gguf or gguf_file(DEFAULT_TARGET)
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"machine: {machine()}")
    bandwidth = memory_gbps(args.repeats)
    print(f"memory: {bandwidth:.1f} GB/s (sum over 1 GiB of float32, best of {args.repeats})")
    weights = load_weights(args.gguf, args.layers)
    if args.interleaved:
        chosen = None if args.interleaved == "all" else set(args.interleaved.split(","))
        weights = [gk.interleave(w) if w.ggml_type in gk.INTERLEAVABLE and w.out_features % gk.GROUP_ROWS == 0
                   and (chosen is None or w.type_name in chosen) else w for w in weights]
        print(f"interleaved: {sum(w.interleaved for w in weights)} of {len(weights)} weights")
    qbytes = sum(w.nbytes for w in weights)
    kinds = sorted({w.type_name for w in weights})
    print(f"{args.gguf.name}: {len(weights)} linear weights ({', '.join(kinds)}), {qbytes / 1e9:.3f} GB; "
          f"memory floor {qbytes / bandwidth / 1e6:.1f} ms")
    inputs = {n: [torch.randn(n, w.in_features) for w in weights] for n in ROWS}

    t1 = {}
    for path in args.paths.split(","):
        if path not in gk.available_paths():
            print(f"{path:>14} skipped: this CPU cannot run it")
            continue
        if args.interleaved:
            laid = [w for w in weights if w.interleaved]
            tiled = sum(gk.interleaved_tiles(w.ggml_type, path) for w in laid)
            if not tiled:
                print(f"{path:>14} skipped: no tiles of the interleaved layout for these types on this path")
                continue
            if tiled < len(laid):
                print(f"{path:>14}: {len(laid) - tiled} interleaved weights are read back into stored blocks here")
        rows = [n for n in ROWS if path != "scalar" or n <= args.scalar_rows]
        times = {n: timed_ms(lambda n=n: [gk.gguf_linear(x, w, path=path) for x, w in zip(inputs[n], weights)],
                              args.repeats if path != "scalar" else 1) for n in rows}
        report(f"gguf {path}", qbytes, times)
        t1[path] = times[1][1]
    if args.floor:
        macs = sum(w.in_features * w.out_features for w in weights)
        print(f"products a row: {macs / 1e9:.3f} G (every linear weight above)")
        report_floor(macs, torch.get_num_threads(), t1)

    if args.no_bf16:
        return
    dense = [gk.dequantize_rows(w, torch.arange(w.out_features)).bfloat16() for w in weights]
    dbytes = sum(d.numel() * 2 for d in dense)
    bf16_inputs = {n: [x.bfloat16() for x in xs] for n, xs in inputs.items()}
    for label, fn in (("torch bf16", F.linear), ("specwise bf16", bf16_kernel_linear)):
        times = {n: timed_ms(lambda n=n: [fn(x, d) for x, d in zip(bf16_inputs[n], dense)], args.repeats)
                 for n in ROWS}
        report(label, dbytes, times)


if __name__ == "__main__":
    main()
