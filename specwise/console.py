"""Human-readable output of a generation: coloured streaming text and the metrics summary."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from specwise.config import SamplingParams, SpecConfig
from specwise.engine import GenerationResult, GenerationStream

DRAFT_STYLE = "green"  # accepted draft tokens
TARGET_STYLE = "bold"  # tokens the target chose itself (recovered or bonus)


def stream_to_console(stream: GenerationStream, color: bool = True) -> GenerationResult:
    """Print text as it is committed: accepted draft tokens apart from the target's own."""
    console = Console(highlight=False, no_color=not color, soft_wrap=True)
    for event in stream:
        if event.text:
            console.print(event.text, style=DRAFT_STYLE if event.from_draft else TARGET_STYLE, end="")
    console.print()
    return stream.result


def print_summary(result: GenerationResult, spec: SpecConfig, sampling: SamplingParams,
                  color: bool = True) -> None:
    console = Console(stderr=True, highlight=False, no_color=not color)
    stats = result.stats
    seconds = stats.to_dict()["seconds"]
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_row("tokens", f"{stats.new_tokens} new ({result.finish_reason}), {len(result.prompt_ids)} in prompt")
    table.add_row("speed", f"{stats.tokens_per_second:.2f} tokens/s over {stats.total_seconds:.2f} s")
    if spec.tree:
        shape = spec.tree_summary()
    else:
        adaptive = spec.resolve_adaptive(sampling)
        shape = f"k {'adaptive ' + str(spec.k_min) + '-' + str(spec.k_max) if adaptive else spec.k}"
    table.add_row("drafter", f"{spec.drafter}, verifier {spec.resolve_verifier(sampling)}, {shape}")
    table.add_row("τ (tokens/step)", f"{stats.acceptance_length:.2f} over {stats.steps} steps")
    table.add_row("α (accepted)", f"{stats.acceptance_rate:.1%} of {stats.proposed} "
                                  f"{'tree nodes' if spec.tree else 'draft tokens'}")
    if stats.per_position_acceptance:
        table.add_row("per depth" if spec.tree else "per position",
                      " ".join(f"{x:.2f}" for x in stats.per_position_acceptance))
    table.add_row("time", f"draft {seconds['draft']:.2f}s, target {seconds['score']:.2f}s "
                          f"(prefill {seconds['prefill']:.2f}s), verify {seconds['verify']:.2f}s, "
                          f"other {seconds['other']:.2f}s")
    legend = f"[{DRAFT_STYLE}]accepted draft[/] / [{TARGET_STYLE}]target's own token[/]"
    console.rule(legend if color else "")
    console.print(table)
