"""PNG plots of benchmark and cost results (matplotlib, headless Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

OVERALL = "overall"


def _grouped_bars(path: Path, rows: dict, tasks: Sequence[str], methods: Sequence[str], value,
                  ylabel: str, title: str, reference_line: float | None = None) -> Path:
    groups = list(tasks) + [OVERALL]
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(groups) + 0.3 * len(methods) + 2.5), 4.5),
                           layout="constrained")
    for i, method in enumerate(methods):
        heights = [value(rows[t, method]) if (t, method) in rows else None for t in groups]
        xs = [g + (i - (len(methods) - 1) / 2) * width for g in range(len(groups))]
        ax.bar([x for x, h in zip(xs, heights) if h is not None], [h for h in heights if h is not None],
               width, label=method)
    if reference_line is not None:
        ax.axhline(reference_line, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)), [g.replace(" ", "\n") for g in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.legend(loc="outside right upper", fontsize=7)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_bench(out_dir: Path, rows: dict, tasks: Sequence[str], methods: Sequence[str],
               baseline: str | None, sweeps: dict) -> list[Path]:
    """speedup.png and tau.png (grouped by task), sweep_k.png when k was swept."""
    out_dir = Path(out_dir)
    paths = []
    compared = [m for m in methods if m != baseline]
    if baseline and compared:
        paths.append(_grouped_bars(out_dir / "speedup.png", rows, tasks, compared, lambda r: r.speedup,
                                   f"speedup vs {baseline}", "Speedup by task", reference_line=1.0))
    with_tau = [m for m in methods if rows.get((OVERALL, m)) and rows[OVERALL, m].tau_kind == "steps"]
    if with_tau:
        paths.append(_grouped_bars(out_dir / "tau.png", rows, tasks, with_tau, lambda r: r.tau,
                                   "τ (tokens per step)", "Acceptance length τ by task", reference_line=1.0))
    if sweeps:
        paths.append(plot_sweep(out_dir / "sweep_k.png", sweeps))
    return paths


def plot_sweep(path: Path, sweeps: dict) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for group, members in sweeps.items():
        ks = [k for k, _ in members]
        left.plot(ks, [r.speedup for _, r in members], marker="o", label=group)
        right.plot(ks, [r.tau for _, r in members], marker="o", label=group)
    left.set_xlabel("k")
    left.set_ylabel("speedup (overall)")
    right.set_xlabel("k")
    right.set_ylabel("τ (overall)")
    left.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    left.legend(fontsize=7)
    fig.suptitle("Block size sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_cost(path: Path, results: Sequence[dict]) -> Path:
    """T(n) in ms against n: one panel per model, one line per weights, runner and context length."""
    models = list(dict.fromkeys(r["model"] for r in results))
    several = len({r["threads"] for r in results}) > 1  # then each line names its thread count
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for result in (r for r in results if r["model"] == model):
            runner = result.get("runner", "hf")
            style = {"lean": "-", "llama.cpp": ":"}.get(runner, "--")
            for context, times in result["seconds"].items():
                ns = sorted(int(n) for n in times)
                ax.plot(ns, [times[str(n)] * 1e3 for n in ns], marker="o", linestyle=style,
                        label=f"{result['dtype']}, {runner}, "
                              f"{str(result['threads']) + ' threads, ' if several else ''}context {context}")
        first = next(r for r in results if r["model"] == model)
        ax.set_xlabel("n (new tokens in one forward pass)")
        ax.set_ylabel("T(n), ms")
        ax.set_ylim(bottom=0)
        ax.set_title(model if several else f"{model} ({first['threads']} threads)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
