"""Self-speculation with the target's own first layers: early-exit drafting whose work the target reuses.

Each draft token comes from the target's first E decoder layers, its final norm and its output
layer (LayerSkip's early exit, Elhoushi et al. 2024; no weights of its own). The rows fed while
drafting (the last committed token and the first k - 1 draft tokens) write their entries of
layers [0, E) into the target's own cache and stash their states after layer E - 1
(specwise.runners.early_exit), so the scoring pass over [last committed] + block runs layers [0, E)
for the last draft token only and layers [E, L) for all rows from the stashed states. On the
compiled GGUF pass the reused states are bitwise what the target computes itself.

Sampling: each draft token is drawn from the exit logits processed exactly as the target's
(specwise.drafters.chain.draft_chain), and that exact distribution is reported; the verifiers run
unchanged. E is SpecConfig.layerskip_exit, or, when it is 0, chosen per request on its prompt by
measurement (specwise.drafters.exit_choice). Chains only: trees are refused.

The drafter needs the target runner the engine scores with (the engine hands it over through
`bind`): the lean runner, one sequence at a time (not the Hugging Face runner, the torch.compile step,
or a batch member).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal, DrafterContext, register_drafter
from specwise.drafters.chain import draft_chain
from specwise.drafters.exit_choice import ExitChoice, choose_exit
from specwise.runners.early_exit import EarlyExit
from specwise.runners.protocols import LayerRangeRunner, ModelRunner
from specwise.verify.result import VerifyResult


class LayerSkipDrafter:
    """Drafts with the bound target runner's first layers (module docstring)."""

    name = "layerskip"

    def __init__(self, exit_layer: int = 0, k: int = 4) -> None:
        """exit_layer: E, or 0 to choose it per request by measurement at draft length k."""
        self.exit_setting = exit_layer
        self.k = k
        self.choice: ExitChoice | None = None  # the last request's, with what it was chosen from
        self._runner: LayerRangeRunner | None = None
        self._exit: EarlyExit | None = None
        self._sampling = SamplingParams()
        self._generator: torch.Generator | None = None

    @property
    def exit_layer(self) -> int | None:
        """The exit layer drafting uses now (None before the first request)."""
        return None if self._exit is None else self._exit.exit_layer

    def bind(self, target: ModelRunner) -> None:
        """Draft with this runner: the one the engine scores with."""
        if not isinstance(target, LayerRangeRunner):
            raise ValueError(f"drafter 'layerskip' drafts with the target's own layers and cache, which "
                             f"{type(target).__name__} cannot run in part; use runner 'lean' (or 'auto' on a "
                             "model the lean runner supports), one sequence at a time (max_batch 1)")
        if target.means.compiled_step:
            raise ValueError("drafter 'layerskip' runs the target's layers in ranges, which the torch.compile step "
                             "cannot; run without compile_step")
        layers = target.num_layers
        if layers < 2 or self.exit_setting >= layers:
            raise ValueError(f"layerskip_exit must be below the target's {layers} decoder layers (0: choose by "
                             f"measurement); got {self.exit_setting}" if layers >= 2 else
                             "drafter 'layerskip' needs a target of at least 2 decoder layers")
        self._runner = target

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams, generator: torch.Generator) -> None:
        if self._runner is None:
            raise ValueError("drafter 'layerskip' is not bound to a target runner: the engine binds it "
                             "(SpeculativeEngine); call bind(runner) first when driving it yourself")
        self._sampling, self._generator = sampling, generator
        if self.exit_setting:
            self.choice = ExitChoice(self.exit_setting, {}, {})
        else:  # in the engine's prefill phase: the measurement is the prompt's cost, not drafting's
            self.choice = choose_exit(self._runner, prompt_ids, self.k)
        self._exit = EarlyExit(self._runner, self.choice.exit_layer)

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        if k <= 0:
            return DraftProposal.empty()
        if self._exit is None:
            raise ValueError("drafter 'layerskip' proposes only after start()")
        if self._runner.length != len(context) - 1:
            raise ValueError(f"layerskip drafts after the target's cache, which holds {self._runner.length} "
                             f"tokens; the context has {len(context)} (the cache must hold all but the last)")
        self._exit.begin()
        first = self._exit.row(context[-1])  # [V]
        return draft_chain(first, context, k, self._sampling, self._generator,
                           lambda i, token: self._exit.row(token))

    def observe(self, result: VerifyResult) -> None:
        pass  # the engine's scoring pass used the stash, and its rollback dropped the rejected rows


def _factory(ctx: DrafterContext) -> LayerSkipDrafter:
    spec = ctx.spec  # trees: the engine refuses them for a drafter without propose_tree
    if spec.runner == "hf":
        raise ValueError("drafter 'layerskip' runs the target's layers in ranges, which the Hugging Face "
                         "runner cannot; use runner 'lean' (or 'auto')")
    # The exit is chosen for the default draft length: k is not a drafter setting (configurations that
    # differ only in k share one drafter), and adaptive k changes it step by step anyway.
    return LayerSkipDrafter(spec.layerskip_exit)


register_drafter("layerskip", _factory)
