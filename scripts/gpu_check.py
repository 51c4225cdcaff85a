"""What speculation gains on this device, with random-weight models whose acceptance is known.

One table per run: for each model shape (random weights built from a transformers
config, no download; speed does not depend on the weights), in --dtype on --device:

- T(n), one lean-runner pass over n new tokens after a --context-token prompt, for
  n = 1..--max-n, with T(n) / T(1); T(1) against the bandwidth floor (bytes of the
  weights a pass reads / --bandwidth);
- greedy decoding of --new-tokens tokens: plain decoding, then speculative decoding with
  drafters whose acceptance is known by construction:
    replay       proposes the target's own plain output (free, every draft accepted):
                 the ceiling, (k + 1) T(1) / T(k + 1);
    corrupt α    replay with each draft token replaced at rate 1 - α (seeded);
    draft model  the target itself as a draft model (every draft accepted, k passes to draft);
    ngram        prompt lookup, on a prompt that repeats one segment;
  each with tokens/s, speedup over plain, τ and α, and its output checked against plain
  decoding token for token (a divergence is classified by specwise.numerics: in
  bfloat16 a near-tie of the target's top two logits is "numerical", anything else a
  FAILURE, and the script exits 1). Random weights give nearly flat next-token
  distributions over a large vocabulary, where the top two logits are often a few
  bfloat16 steps apart: a divergence just outside the tie rule can then be rounding
  between a block pass and one-token passes rather than a bug; --dtype float32 tells
  the two apart (the check never widens its tolerance to hide one).

    python scripts/gpu_check.py                          # on a GPU: 1.5B and ~7B shapes, ~minutes
    python scripts/gpu_check.py --shapes tiny --dtype float32 --max-n 4 --new-tokens 16   # CI, on CPU
    python scripts/gpu_check.py --shapes 1.5b --max-n 4 --new-tokens 8 --ks 4             # a CPU look
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from specwise.config import SamplingParams, SpecConfig  # noqa: E402
from specwise.device import resolve_device, synchronize  # noqa: E402
from specwise.drafters.base import DraftProposal  # noqa: E402
from specwise.drafters.draft_model import DraftModelDrafter  # noqa: E402
from specwise.drafters.ngram import NgramDrafter, NoDrafter  # noqa: E402
from specwise.engine import GenerationResult, SpeculativeEngine  # noqa: E402
from specwise.runners.lean import LeanRunner  # noqa: E402
from specwise.store.loading import resolve_dtype  # noqa: E402
from specwise.numerics import check_identity  # noqa: E402

# Qwen2.5-Coder-1.5B-Instruct (the default target) and Qwen2.5-7B-Instruct, from their config.json.
SHAPES = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
}
H200_BANDWIDTH = 4.3e12  # bytes/s (HBM3e, NVIDIA's figure 4.8 TB/s; ~4.3 reached by a copy kernel)


def build_model(shape: str, dtype: torch.dtype, device: torch.device, init: float, seed: int) -> Qwen2ForCausalLM:
    """A random model of this shape, made directly in dtype on the device (no float32 copy on the host)."""
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         initializer_range=init, use_cache=True, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def bytes_per_pass(model: Qwen2ForCausalLM) -> int:
    """Bytes of weights one decoding pass reads: all of them but the input embedding table, of which
    a pass reads a few rows (unless it is the output layer too)."""
    seen, total = set(), 0
    skip = None if model.config.tie_word_embeddings else model.get_input_embeddings().weight
    for parameter in model.parameters():
        if id(parameter) in seen or parameter is skip:
            continue
        seen.add(id(parameter))
        total += parameter.numel() * parameter.element_size()
    return total


def time_passes(runner: LeanRunner, context: list[int], ns: Sequence[int], repeats: int) -> dict[int, float]:
    """Median seconds of one pass over n new tokens after `context`, for each n."""
    device = runner.device
    block = [(7 * i + 3) % runner.vocab_size for i in range(max(ns))]
    runner.reset()
    runner.forward(context, logits=False)
    seconds = {}
    for n in ns:
        runner.forward(block[:n])  # warm-up (and, compiled, the graph of this size)
        runner.rollback(n)
        samples = []
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            runner.forward(block[:n])
            synchronize(device)
            samples.append(time.perf_counter() - start)
            runner.rollback(n)
        seconds[n] = statistics.median(samples)
    return seconds


class ReplayDrafter:
    """Proposes the continuation of a known output (the target's own plain decoding): every draft
    token is accepted while the run agrees with it, and drafting costs nothing."""

    name = "replay"

    def __init__(self, output: Sequence[int], keep: float = 1.0, seed: int = 0, vocab_size: int = 2) -> None:
        self.output, self.keep, self.vocab_size = list(output), keep, vocab_size
        self._seed = seed
        self._prompt_length = 0
        self._rng = torch.Generator()

    def start(self, prompt_ids, sampling, generator) -> None:
        self._prompt_length = len(prompt_ids)
        self._rng.manual_seed(self._seed)  # the same corruptions for every run

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        done = len(context) - self._prompt_length
        tokens = self.output[done:done + k]
        if self.keep < 1.0:  # replace each token at rate 1 - keep by another one: it is rejected
            corrupt = (torch.rand(len(tokens), generator=self._rng) >= self.keep).tolist()
            tokens = [(t + 1) % self.vocab_size if c else t for t, c in zip(tokens, corrupt)]
        return DraftProposal(torch.tensor(tokens, dtype=torch.long), None)

    def observe(self, result) -> None:
        pass


@dataclass
class Row:
    shape: str
    what: str
    k: str = ""
    value: str = ""  # ms per pass, or tokens/s
    ratio: str = ""  # T(n)/T(1), or speedup over plain
    tau: str = ""
    alpha: str = ""
    greedy: str = ""
    failures: list[str] = field(default_factory=list)


def decode(runner: LeanRunner, drafter, k: int, prompt: list[int], new_tokens: int) -> tuple[GenerationResult, float]:
    """One greedy generation (after a short warm-up one) and its decoding time, prefill excluded."""
    spec = SpecConfig(drafter="none" if isinstance(drafter, NoDrafter) else "ngram", k=k, adaptive=False)
    engine = SpeculativeEngine(runner, drafter, spec)
    sampling = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    engine.generate(prompt, SamplingParams(max_new_tokens=min(8, new_tokens), ignore_eos=True))
    result = engine.generate(prompt, sampling)
    seconds = result.stats.total_seconds - result.stats.prefill_seconds
    return result, seconds


def check_shape(shape: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[Row]:
    model = build_model(shape, dtype, device, args.init, args.seed)
    runner = LeanRunner(model)
    if args.compile:
        from specwise.runners.torch_step import CompiledLeanRunner

        runner = CompiledLeanRunner(model)
    vocab = runner.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    context = torch.randint(0, vocab, (args.context,), generator=g).tolist()
    rows: list[Row] = []

    seconds = time_passes(runner, context, range(1, args.max_n + 1), args.repeats)
    weight_bytes = bytes_per_pass(model)
    floor = weight_bytes / args.bandwidth
    for n, s in seconds.items():
        note = f"floor {_ms(floor)} ({weight_bytes / 1e9:.3g} GB / {args.bandwidth / 1e12:.3g} TB/s): T(1) at " \
               f"{floor / s:.0%} of the bandwidth" if n == 1 else ""
        rows.append(Row(shape, "T(n)", str(n), _ms(s), f"{s / seconds[1]:.2f}", greedy=note))

    plain, plain_seconds = decode(runner, NoDrafter(), 1, context, args.new_tokens)
    reference = plain.token_ids
    plain_rate = len(reference) / plain_seconds
    rows.append(Row(shape, "plain decoding", "", f"{plain_rate:.1f} tok/s", "1.00", "1.00", "", "reference"))

    segment = context[:max(8, args.context // 4)]
    repeating = (segment * (args.context // len(segment) + 1))[:args.context]
    ngram_plain, ngram_plain_seconds = decode(runner, NoDrafter(), 1, repeating, args.new_tokens)
    runs = []
    for k in args.ks:
        runs.append(("replay", k, ReplayDrafter(reference), context, reference, plain_rate))
        for alpha in args.alphas:
            runs.append((f"corrupt α={alpha}", k, ReplayDrafter(reference, alpha, args.seed, vocab), context,
                         reference, plain_rate))
        if not args.no_draft_model:
            runs.append(("draft model = target", k, DraftModelDrafter(LeanRunner(model), vocab), context,
                         reference, plain_rate))
        runs.append(("ngram, repeating prompt", k, NgramDrafter(), repeating, ngram_plain.token_ids,
                     len(ngram_plain.token_ids) / ngram_plain_seconds))
    for what, k, drafter, prompt, expected, base_rate in runs:
        result, s = decode(runner, drafter, k, prompt, args.new_tokens)
        rate = len(result.token_ids) / s
        mismatch = check_identity(model, prompt, expected, result.token_ids)
        verdict = "identical" if mismatch is None else (
            f"numerical near-tie at token {mismatch.position}" if mismatch.numerical else
            f"FAILURE: {mismatch.describe()}")
        row = Row(shape, what, str(k), f"{rate:.1f} tok/s", f"{rate / base_rate:.2f}",
                  f"{result.stats.acceptance_length:.2f}", f"{result.stats.acceptance_rate:.2f}", verdict)
        if mismatch is not None and not mismatch.numerical:
            row.failures.append(verdict)
        rows.append(row)
    del runner, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def fits(shape: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a shape's weights (with room for caches and activations) fit the device's free memory."""
    if device.type != "cuda":
        return True
    config = SHAPES[shape]
    h, i, layers, v = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], \
        config["vocab_size"]
    params = layers * (4 * h * h + 3 * h * i) + v * h * (1 if config["tie_word_embeddings"] else 2)
    free, _ = torch.cuda.mem_get_info(device)
    return 1.5 * params * torch.finfo(dtype).bits / 8 < free


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def print_table(rows: list[Row], header: str) -> None:
    columns = ("shape", "measure", "n / k", "time or rate", "×T(1) / speedup", "τ", "α", "greedy check / note")
    cells = [columns] + [(r.shape, r.what, r.k, r.value, r.ratio, r.tau, r.alpha, r.greedy) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    print(header)
    for j, line in enumerate(cells):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |")
        if j == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    parser.add_argument("--shapes", default=None,
                        help="comma-separated of tiny, 1.5b, 7b (default: 1.5b,7b on CUDA, 1.5b on the CPU); "
                             "7b is skipped where it does not fit")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-n", type=int, default=64, help="T(n) for n = 1..max-n (default 64)")
    parser.add_argument("--context", type=int, default=128, help="prompt tokens before each pass (default 128)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per T(n) point, median kept (default 5)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per generation (default 128)")
    parser.add_argument("--ks", type=lambda t: [int(x) for x in t.split(",")], default=[4, 8],
                        help="draft block sizes (default 4,8)")
    parser.add_argument("--alphas", type=lambda t: [float(x) for x in t.split(",")], default=[0.7],
                        help="acceptance rates of the corrupting drafter (default 0.7)")
    parser.add_argument("--no-draft-model", action="store_true", help="skip the target-as-draft-model rows")
    parser.add_argument("--compile", action="store_true",
                        help="the lean runner's torch.compile step (torch.compile; each block size compiles once)")
    parser.add_argument("--bandwidth", type=float, default=H200_BANDWIDTH,
                        help="memory bandwidth in bytes/s for the T(1) floor (default 4.3e12, an H200)")
    parser.add_argument("--init", type=float, default=0.02, help="initializer range of the random weights")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.max_n < 1 or args.new_tokens < 1 or args.context < 2 or min(args.ks) < 1:
        parser.error("--max-n, --new-tokens and --ks must be >= 1, --context >= 2")

    device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    shapes = (args.shapes or ("1.5b,7b" if device.type == "cuda" else "1.5b")).split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; choose from {', '.join(SHAPES)}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    started = time.perf_counter()
    rows: list[Row] = []
    skipped = []
    for shape in shapes:
        if not fits(shape, device, dtype):
            skipped.append(shape)
            continue
        rows += check_shape(shape, args, device, dtype)
    header = (f"specwise GPU check on {device} ({name}), torch {torch.__version__}, {args.dtype}, random weights, "
              f"context {args.context}, {args.new_tokens} new tokens, greedy"
              f"{', torch.compile step' if args.compile else ''}; {time.perf_counter() - started:.0f} s")
    print_table(rows, header)
    if skipped:
        print(f"skipped (not enough free device memory): {', '.join(skipped)}")
    failures = [f for r in rows for f in r.failures]
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
