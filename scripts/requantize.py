"""Re-quantize a GGUF file with llama.cpp's own quantizer into the mixes users bring.

    .venv/bin/python scripts/requantize.py                      # the default target, four mixes
    .venv/bin/python scripts/requantize.py --gguf FILE.gguf --types q5_k_m,q4_1 --out /tmp/mixes

Writes one file per mix (`<stem>-<mix>.gguf`) and prints the block types each holds, so that
specwise can be tried on the files a llama.cpp or ollama user has: `specwise generate --target
FILE.gguf`. Re-quantizing an already quantized file (the default target is Q4_K_M) is what
llama.cpp's `--allow-requantize` does: the numbers are a little worse than quantizing from
float weights, and the block layout is exactly that of a file quantized from them.
Needs llama-cpp-python (`bash scripts/install.sh --llamacpp`).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections import Counter
from pathlib import Path

DEFAULT_MIXES = ("q8_0", "q5_k_m", "q4_0", "iq4_xs")


def mix_ftype(llama_cpp, mix: str) -> int:
    """llama.cpp's file-type constant for a mix name such as q5_k_m."""
    name = f"LLAMA_FTYPE_MOSTLY_{mix.upper()}"
    if not hasattr(llama_cpp, name):
        known = sorted(n.removeprefix("LLAMA_FTYPE_MOSTLY_").lower() for n in dir(llama_cpp)
                       if n.startswith("LLAMA_FTYPE_MOSTLY_"))
        raise SystemExit(f"unknown mix {mix!r}; llama.cpp knows: {', '.join(known)}")
    return int(getattr(llama_cpp, name))


def quantize(llama_cpp, source: Path, out: Path, ftype: int, threads: int) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = ftype
    params.allow_requantize = True
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    if status != 0:
        out.unlink(missing_ok=True)
        raise SystemExit(f"llama.cpp's quantizer failed ({status}) writing {out}")


def block_types(path: Path) -> Counter:
    """How many tensors of the file are stored in each block type."""
    from gguf import GGUFReader

    return Counter(tensor.tensor_type.name for tensor in GGUFReader(path).tensors)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, help="the file to re-quantize (default: the default target's GGUF)")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="a catalog model whose GGUF to use")
    parser.add_argument("--types", default=",".join(DEFAULT_MIXES),
                        help=f"comma-separated mixes (default {','.join(DEFAULT_MIXES)})")
    parser.add_argument("--out", type=Path, help="folder for the files (default: $SPECWISE_HOME/requantized)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit("llama-cpp-python is not installed: bash scripts/install.sh --llamacpp") from None
    if args.gguf is None:
        from specwise.store.prepare import gguf_file

        args.gguf = gguf_file(args.model)
    if args.out is None:
        from specwise.paths import specwise_home

        args.out = specwise_home() / "requantized"
    args.out.mkdir(parents=True, exist_ok=True)
    for mix in (m.strip().lower() for m in args.types.split(",") if m.strip()):
        target = args.out / f"{args.gguf.stem.removesuffix('-q4_k_m')}-{mix}.gguf"
        if not target.exists():
            start = time.perf_counter()
            print(f"{mix}: writing {target}", file=sys.stderr, flush=True)
            quantize(llama_cpp, args.gguf, target, mix_ftype(llama_cpp, mix), args.threads)
            print(f"{mix}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        types = ", ".join(f"{name} x{count}" for name, count in block_types(target).most_common())
        print(f"{target}\t{target.stat().st_size / 1e9:.2f} GB\t{types}")


if __name__ == "__main__":
    main()
