"""A projection, not a measurement: T(n) and the speculative speedup on more cores than were measured.

`specwise bench cost --threads 1,2` measures T(n) at two thread counts and the machine's read
bandwidth at each; `specwise bench project` fits the model below to those tables and evaluates it
at other core counts. The model of one pass over n new tokens on c cores is

    T(n, c) = O + max(W / B(c), A / c) + (n − 1) · R / c

- W: the bytes of weights a pass reads (`pass_bytes`, recorded in the table), B(c): the read
  bandwidth at c cores. W / B(c) is the memory floor: no pass is faster.
- A: one row's arithmetic in core-seconds. It runs while the weights stream in, so the first row
  costs the larger of the two.
- R: each further row's arithmetic in core-seconds (a tile of rows shares each unpacked weight
  block, so a row adds only its own products); it does not hide under the memory time.
- O: a fixed cost per pass that more cores do not shorten (the layers' serial steps, thread
  hand-offs, the Python step), and with it whatever part of memory and arithmetic time does not
  overlap at the measured counts.

Its assumptions, each a way it can be wrong: arithmetic divides evenly over c physical cores
(1/c: no SMT siblings counted as cores, no frequency drop as more cores run); B(c) is the measured
figure at a measured count, linear between measured counts, and beyond the last one grows by what
the last measured core added, up to a saturation figure (default: the highest measured, i.e. no
more bandwidth than was seen; `--bandwidth` states another), on one NUMA node; O stays as it is.

The fit: R by least squares through T_c(n) − T_c(1) = (n − 1) · R / c over every measured count
and every measured n up to `max_rows` (default 8: past a few tiles' worth of rows the kernel may
change route, and T(n) is no longer one line; on an AMX Xeon T(16) is 2.9 × T(1) where T(8) is
1.3-1.4 ×); then O ≥ 0 and A ≥ 0 by least squares through the measured T_c(1) (with two counts, two
equations and two unknowns: it passes through both unless no O ≥ 0 fits). The speedup of a free
drafter (no drafting cost) at acceptance α is the cost model's (docs/DESIGN.md, "Cost model"):
E[τ](α, k) · T(1) / T(k + 1) at the k that `specwise.adaptive.best_block_size` chooses, k + 1 no
more than the rows fitted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specwise.adaptive import best_block_size
from specwise.cost_model import cost_function
from specwise.estimators import expected_acceptance_length

DEFAULT_CORES = (4, 8, 16)
DEFAULT_ALPHAS = (0.35, 0.6)
DEFAULT_MAX_ROWS = 8  # the largest n the line of extra rows is fitted to; k + 1 stays within it
FIT_TOLERANCE = 0.10  # the largest relative gap between the fit and a measured T(n) it reports as a fair fit
MEASURE_AGAIN = "specwise bench cost --formats gguf --runners lean --threads 1,2"


@dataclass(frozen=True)
class Bandwidth:
    """Read bandwidth B(c) in bytes/s: through the measured (cores, bytes/s) points, linear between
    them; past the last, growing by what the last measured core added, never above `saturation`."""

    measured: tuple[tuple[int, float], ...]
    saturation: float

    def __post_init__(self) -> None:
        if not self.measured:
            raise ValueError("a bandwidth model needs at least one measured (cores, bytes/s) point")
        top = max(rate for _, rate in self.measured)
        if self.saturation < top * (1 - 1e-9):
            raise ValueError(f"the saturation bandwidth {self.saturation / 1e9:.1f} GB/s is below the measured "
                             f"{top / 1e9:.1f} GB/s")

    @property
    def per_core_gain(self) -> float:
        """Bytes/s the last measured core added (one point: its bandwidth per core)."""
        points = sorted(self.measured)
        if len(points) == 1:
            return points[0][1] / points[0][0]
        (c0, b0), (c1, b1) = points[-2], points[-1]
        return max(0.0, (b1 - b0) / (c1 - c0))

    def __call__(self, cores: float) -> float:
        points = sorted(self.measured)
        if cores <= points[0][0]:
            return points[0][1] * cores / points[0][0]
        for (c0, b0), (c1, b1) in zip(points, points[1:]):
            if cores <= c1:
                return b0 + (b1 - b0) * (cores - c0) / (c1 - c0)
        c1, b1 = points[-1]
        return min(self.saturation, b1 + self.per_core_gain * (cores - c1))


@dataclass(frozen=True)
class PassModel:
    """T(n, c) = overhead + max(pass_bytes / B(c), row_seconds / c) + (n − 1) · extra_row_seconds / c."""

    overhead: float  # O, seconds
    row_seconds: float  # A, core-seconds of the first row's arithmetic
    extra_row_seconds: float  # R, core-seconds of each further row
    pass_bytes: float  # W
    bandwidth: Bandwidth

    def memory_floor(self, cores: float) -> float:
        return self.pass_bytes / self.bandwidth(cores)

    def seconds(self, n: int, cores: float) -> float:
        return (self.overhead + max(self.memory_floor(cores), self.row_seconds / cores)
                + (n - 1) * self.extra_row_seconds / cores)

    def cost(self, cores: float) -> Callable[[int], float]:
        """T(n) at `cores`, the function the speedup rule reads."""
        return lambda n: self.seconds(n, cores)


@dataclass(frozen=True)
class Measured:
    """One thread count's table: T(n) in seconds at one context, and the read bandwidth at that count."""

    threads: int
    seconds: dict[int, float]
    bandwidth: float  # bytes/s

    def cost(self) -> Callable[[int], float]:
        return cost_function({"seconds": {"0": {str(n): s for n, s in self.seconds.items()}}})


def fit_extra_row(tables: Sequence[Measured], max_rows: int = DEFAULT_MAX_ROWS) -> float:
    """R by least squares through T_c(n) − T_c(1) = (n − 1) · R / c over n ≤ max_rows (never below 0)."""
    sxx = sxy = 0.0
    for table in tables:
        for n, seconds in table.seconds.items():
            if n > max_rows:
                continue
            x = (n - 1) / table.threads
            sxx, sxy = sxx + x * x, sxy + x * (seconds - table.seconds[1])
    if sxx == 0:
        raise ValueError("the tables measure n = 1 only; an extra row's cost needs larger n, e.g. --n 1,2,4,8")
    return max(0.0, sxy / sxx)


def fit_first_row(first: Sequence[tuple[int, float, float]]) -> tuple[float, float]:
    """(O, A) ≥ 0 by least squares through T_c(1) = O + max(M_c, A / c), for (c, T_c(1), M_c) triples.

    The squared error is a quadratic in (O, A) between the A where a count turns from memory-bound
    to compute-bound (A = c · M_c); on each such piece the least squares under O ≥ 0 and the piece's
    bounds on A lies inside or on an edge, so those candidates are all tried.
    """
    breaks = sorted({0.0, *(c * memory for c, _, memory in first)})
    pieces = list(zip(breaks, breaks[1:] + [math.inf]))
    best: tuple[float, float, float] | None = None  # (error, O, A)
    for low, high in pieces:
        probe = low + 1.0 if high == math.inf else (low + high) / 2
        u = [1.0 / c if probe / c > memory else 0.0 for c, _, memory in first]  # compute-bound: A / c
        y = [t1 - (0.0 if ui else memory) for ui, (_, t1, memory) in zip(u, first)]

        def error(o: float, a: float) -> float:
            return sum((yi - o - a * ui) ** 2 for yi, ui in zip(y, u))

        def edge_a(a: float) -> tuple[float, float]:  # A fixed: the best O ≥ 0
            return max(0.0, sum(yi - a * ui for yi, ui in zip(y, u)) / len(y)), a

        def clip(a: float) -> float:
            return min(max(a, low), high)

        candidates = [edge_a(low)] + ([edge_a(high)] if high != math.inf else [])
        suu = sum(ui * ui for ui in u)
        if suu > 0:
            candidates.append((0.0, clip(sum(ui * yi for ui, yi in zip(u, y)) / suu)))  # O = 0
            mean_u, mean_y = sum(u) / len(u), sum(y) / len(y)
            spread = sum((ui - mean_u) ** 2 for ui in u)
            if spread > 0:
                a = sum((ui - mean_u) * (yi - mean_y) for ui, yi in zip(u, y)) / spread
                if low <= a <= high and mean_y - a * mean_u >= 0:
                    candidates.append((mean_y - a * mean_u, a))
        for o, a in candidates:
            if best is None or error(o, a) < best[0] - 1e-18:
                best = (error(o, a), o, a)
    assert best is not None
    return best[1], best[2]


def fit(tables: Sequence[Measured], pass_bytes: float, saturation: float | None = None,
        max_rows: int = DEFAULT_MAX_ROWS) -> PassModel:
    """The pass model through tables at two or more thread counts (`saturation`: bytes/s, default the
    highest measured bandwidth)."""
    counts = sorted({table.threads for table in tables})
    if len(counts) < 2:
        raise ValueError(f"a projection needs T(n) at two thread counts; the tables hold "
                         f"{', '.join(map(str, counts)) or 'none'} (measure both: {MEASURE_AGAIN})")
    for table in tables:
        if 1 not in table.seconds:
            raise ValueError(f"the {table.threads}-thread table has no T(1)")
    measured = tuple(sorted((table.threads, table.bandwidth) for table in tables))
    bandwidth = Bandwidth(measured, saturation if saturation is not None else max(b for _, b in measured))
    overhead, row = fit_first_row([(t.threads, t.seconds[1], pass_bytes / t.bandwidth) for t in tables])
    return PassModel(overhead, row, fit_extra_row(tables, max_rows), pass_bytes, bandwidth)


# --------------------------------------------------------------------------- reading bench cost's output


def read_results(paths: Sequence[str | Path]) -> list[dict]:
    """The tables of `bench cost` outputs: a directory holding cost.json, a cost.json, or a saved table."""
    results = []
    for path in map(Path, paths):
        file = path / "cost.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"{path} holds no cost.json; give the --out directory of `specwise bench cost`")
        data = json.loads(file.read_text(encoding="utf-8"))
        results += data["results"] if "results" in data else [data]
    return results


def select(results: Sequence[dict], model: str | None = None, runner: str = "lean", dtype: str = "gguf",
           context: int | None = None) -> tuple[list[Measured], float, str, int]:
    """(the tables of one model, runner and weights at one context, bytes a pass reads, model, context).

    model: default the first measured (`bench cost` measures the target first); context: default
    the smallest measured.
    """
    chosen = [r for r in results if r.get("runner") == runner and r.get("dtype") == dtype
              and (model is None or r.get("model") == model)]
    if not chosen:
        kinds = sorted({f"{r.get('model')} ({r.get('runner')}, {r.get('dtype')})" for r in results})
        raise ValueError(f"no {runner} table of {model or 'any model'} with {dtype} weights; the tables hold "
                         f"{', '.join(kinds) or 'nothing'}")
    model = chosen[0]["model"]
    chosen = [r for r in chosen if r["model"] == model]
    contexts = sorted(set.intersection(*({int(c) for c in r["seconds"]} for r in chosen)))
    if not contexts:
        raise ValueError(f"the tables of {model} share no measured context")
    context = min(contexts, key=lambda c: abs(c - context)) if context is not None else contexts[0]
    tables, sizes = [], set()
    for result in chosen:
        machine = result.get("machine", {})
        if machine.get("read_bandwidth_threads") != result["threads"]:
            raise ValueError(f"the {result['threads']}-thread table of {model} records no read bandwidth measured "
                             f"at {result['threads']} threads (earlier tables record one figure); "
                             f"measure again: {MEASURE_AGAIN}")
        if "pass_bytes" in result:
            sizes.add(int(result["pass_bytes"]))
        seconds = {int(n): float(s) for n, s in result["seconds"][str(context)].items()}
        tables.append(Measured(int(result["threads"]), seconds, float(machine["read_bandwidth_gb_s"]) * 1e9))
    if len({t.threads for t in tables}) < len(tables):
        raise ValueError(f"the tables hold more than one {runner} table of {model} at one thread count; "
                         "give one bench cost output")
    if not sizes:
        raise ValueError(f"the tables of {model} do not record the bytes a pass reads (pass_bytes); "
                         f"measure again: {MEASURE_AGAIN}")
    return sorted(tables, key=lambda t: t.threads), float(max(sizes)), model, context


# --------------------------------------------------------------------------- the projected table


@dataclass(frozen=True)
class Row:
    cores: int
    source: str  # "measured" or "projected"
    bandwidth: float  # bytes/s
    floor: float  # seconds: pass bytes / bandwidth
    t1: float
    t5_ratio: float
    speedups: tuple[tuple[float, int, float], ...]  # (α, best k, speedup)


def free_drafter_speedup(cost: Callable[[int], float], alpha: float,
                         k_max: int = DEFAULT_MAX_ROWS - 1) -> tuple[int, float]:
    """(k, speedup over plain decoding) of a drafter that costs nothing, at the k adaptive drafting chooses."""
    k = best_block_size(alpha, 1, k_max, 0.0, cost)
    return k, expected_acceptance_length(alpha, k) * cost(1) / cost(k + 1)


def row(cores: int, source: str, cost: Callable[[int], float], bandwidth: float, pass_bytes: float,
        alphas: Sequence[float], k_max: int) -> Row:
    return Row(cores, source, bandwidth, pass_bytes / bandwidth, cost(1), cost(5) / cost(1),
               tuple((alpha, *free_drafter_speedup(cost, alpha, k_max)) for alpha in alphas))


def project(tables: Sequence[Measured], pass_bytes: float, cores: Sequence[int] = DEFAULT_CORES,
            alphas: Sequence[float] = DEFAULT_ALPHAS, saturation: float | None = None,
            max_rows: int = DEFAULT_MAX_ROWS, k_max: int | None = None) -> tuple[PassModel, list[Row]]:
    """The fitted model, and rows: each measured count as measured, then the model at the measured
    counts (its check) and at `cores`; k up to `k_max` (default max_rows − 1) in both."""
    if any(c < 1 for c in cores):
        raise ValueError(f"core counts must be >= 1; got {list(cores)}")
    k_max = max_rows - 1 if k_max is None else k_max
    if not 1 <= k_max < max_rows:
        raise ValueError(f"k + 1 must stay within the fitted rows: k_max in [1, {max_rows - 1}]; got {k_max}")
    model = fit(tables, pass_bytes, saturation, max_rows)
    rows = [row(t.threads, "measured", t.cost(), t.bandwidth, pass_bytes, alphas, k_max) for t in tables]
    for c in sorted({*(t.threads for t in tables), *cores}):
        rows.append(row(c, "projected", model.cost(c), model.bandwidth(c), pass_bytes, alphas, k_max))
    return model, rows


def fit_gaps(model: PassModel, tables: Sequence[Measured], max_rows: int = DEFAULT_MAX_ROWS) -> dict[int, float]:
    """The largest relative gap |model − measured| / measured over each count's measured n ≤ max_rows."""
    return {t.threads: max(abs(model.seconds(n, t.threads) - s) / s for n, s in t.seconds.items() if n <= max_rows)
            for t in tables}


def markdown(model: PassModel, rows: Sequence[Row], tables: Sequence[Measured], name: str, context: int,
             max_rows: int = DEFAULT_MAX_ROWS) -> str:
    """The projection as a Markdown note: the fitted parameters, the fit's check, the table."""
    gaps = fit_gaps(model, tables, max_rows)
    k_max = max(k for r in rows for _, k, _ in r.speedups)
    counts = ", ".join(str(t.threads) for t in tables)
    saturation = model.bandwidth.saturation / 1e9
    lines = [
        f"A projection, not a measurement: {name}, context {context}, fitted to the measured tables at "
        f"{counts} threads.",
        "",
        f"- model: T(n, c) = O + max(W / B(c), A / c) + (n − 1) · R / c with O = {1e3 * model.overhead:.1f} ms, "
        f"A = {1e3 * model.row_seconds:.1f} core-ms, R = {1e3 * model.extra_row_seconds:.2f} core-ms, "
        f"W = {model.pass_bytes / 1e9:.3f} GB",
        f"- bandwidth: measured {', '.join(f'{b / 1e9:.1f} GB/s at {c}' for c, b in model.bandwidth.measured)}; "
        f"past that +{model.bandwidth.per_core_gain / 1e9:.1f} GB/s a core, saturating at {saturation:.1f} GB/s",
        f"- fit over n ≤ {max_rows}: largest gap to a measured T(n) {', '.join(f'{100 * g:.1f} % at {c}' for c, g in gaps.items())}"
        + ("" if max(gaps.values()) <= FIT_TOLERANCE else f" (over {100 * FIT_TOLERANCE:.0f} %: a rough fit)"),
        "- speedup: a free drafter (no drafting cost) at acceptance α, E[τ](α, k) · T(1) / T(k + 1) at the best "
        f"k ≤ {max_rows - 1} (the largest chosen: {k_max})",
        "",
    ]
    alphas = [alpha for alpha, _, _ in rows[0].speedups]
    header = ["cores", "", "read bandwidth", "memory floor", "T(1)", "T(5)/T(1)"] + [f"α = {a:g}: k, speedup"
                                                                                   for a in alphas]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        cells = [str(r.cores), r.source, f"{r.bandwidth / 1e9:.1f} GB/s", f"{1e3 * r.floor:.1f} ms",
                 f"{1e3 * r.t1:.1f} ms", f"{r.t5_ratio:.2f}"] + [f"{k}, {s:.2f}x" for _, k, s in r.speedups]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def as_json(model: PassModel, rows: Sequence[Row], tables: Sequence[Measured], name: str, context: int,
            max_rows: int = DEFAULT_MAX_ROWS) -> dict:
    return {
        "kind": "projection (not a measurement)", "model": name, "context": context, "max_rows": max_rows,
        "fit": {"overhead_s": model.overhead, "row_core_s": model.row_seconds,
                "extra_row_core_s": model.extra_row_seconds, "pass_bytes": model.pass_bytes,
                "bandwidth_measured_b_s": [list(p) for p in model.bandwidth.measured],
                "bandwidth_saturation_b_s": model.bandwidth.saturation,
                "largest_gap": {str(c): g for c, g in fit_gaps(model, tables, max_rows).items()}},
        "rows": [{"cores": r.cores, "source": r.source, "bandwidth_b_s": r.bandwidth, "floor_s": r.floor,
                  "t1_s": r.t1, "t5_over_t1": r.t5_ratio,
                  "speedups": [{"alpha": a, "k": k, "speedup": s} for a, k, s in r.speedups]} for r in rows],
    }
