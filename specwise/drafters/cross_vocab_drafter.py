"""The draft-model drafter for a draft model whose tokenizer differs from the target's.

The draft-model factory chooses it when the two tokenizers differ (specwise.drafters.pairing).
It drafts in its own vocabulary over its own KV cache, kept across steps like DraftModelDrafter's:
after each step the committed target tokens' new text is encoded into drafter tokens from a
short tail (specwise.drafters.cross_vocab.DraftTokens) and the cache rolled back only to where
those tokens first differ from it. Greedy drafts go through text into stable target tokens;
sampled drafts follow Token-Level Intersection (see specwise.drafters.cross_vocab for both rules).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal, DrafterContext
from specwise.drafters.chain import common_prefix_length
from specwise.drafters.cross_vocab import (CommittedText, DraftTokens, TextCodec, TokenizerCodec, VocabularyMap,
                                           appended_text, stable_target_tokens)
from specwise.runners.protocols import ModelRunner
from specwise.sampling import draft_token, logits_to_probs, sample, seen_token_mask
from specwise.settings import ConfigError
from specwise.verify.result import VerifyResult


class CrossVocabDrafter:
    """Drafts with a small LM of another vocabulary: through text (greedy) or the shared tokens (TLI)."""

    name = "draft-model"

    def __init__(self, runner: ModelRunner, vocabulary: VocabularyMap, target_codec: TextCodec,
                 draft_codec: TextCodec) -> None:
        self.runner = runner
        self.vocabulary = vocabulary
        self.vocab_size = vocabulary.target_width  # the target's logits width: draft rows are this wide
        self.target_codec, self.draft_codec = target_codec, draft_codec
        self._committed = CommittedText(target_codec)
        self._tokens = DraftTokens(draft_codec)
        self._cached: list[int] = []  # the drafter ids in the runner's cache
        self._sampling = SamplingParams()
        self._generator: torch.Generator | None = None

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams, generator: torch.Generator) -> None:
        self._sampling, self._generator = sampling, generator
        # The prompt is decoded and encoded once per generation; steps then convert their new tokens only.
        self._committed.reset(prompt_ids)
        self._tokens.reset(self._committed.text)
        ids = self._tokens.ids
        if len(ids) > 1:
            # Prefill now, so that the first proposal's time is drafting only (as DraftModelDrafter).
            self._bring_cache_to(ids[:-1])

    def forget(self) -> None:
        """Empty the cache: the next start reads its whole prompt (see base.forget_prompts)."""
        self.runner.reset()
        self._cached = []

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        if k <= 0:
            return DraftProposal.empty()
        if self._committed.extend(context):
            self._tokens.extend(self._committed.text)
        logits = self._logits_after_text()
        if logits is None:
            return DraftProposal.empty()
        if self._sampling.greedy:
            return self._propose_through_text(context, logits, k)
        return self._propose_intersection(logits, k, len(context))

    def observe(self, result: VerifyResult) -> None:
        pass  # the committed tokens reach the drafter as text at the next proposal

    def _bring_cache_to(self, ids: list[int]) -> None:
        """Bring the cache to `ids` from its longest common prefix with them, computing no logits."""
        common = common_prefix_length(self._cached, ids, len(ids))
        self.runner.rollback(self.runner.length - common)
        if ids[common:]:
            self.runner.forward(ids[common:], logits=False)
        self._cached = list(ids)

    def _logits_after_text(self) -> torch.Tensor | None:
        """The drafter's logits [draft width] after its tokens of the committed text (None: no tokens)."""
        ids = self._tokens.ids
        if not ids:
            return None
        common = common_prefix_length(self._cached, ids, len(ids) - 1)  # feed at least one token for logits
        self.runner.rollback(self.runner.length - common)
        logits = self.runner.forward(ids[common:])[-1]
        self._cached = list(ids)
        return logits

    def _feed(self, token: int) -> torch.Tensor:
        """Append one drafter token; its next-token logits [draft width]."""
        self._cached.append(token)
        return self.runner.forward([token])[-1]

    def _seen(self) -> torch.Tensor | None:
        """The drafter's own tokens for its repetition penalty ([draft width] bool), None without one."""
        if self._sampling.repetition_penalty == 1.0:
            return None
        return seen_token_mask(self._cached, [], self.vocabulary.draft_width)[0]

    def _propose_through_text(self, context: Sequence[int], logits: torch.Tensor, k: int) -> DraftProposal:
        """Greedy: k + 1 argmax drafter tokens (the last converted token is left out as unstable, so
        one more keeps about k), their text, then its stable target tokens as point masses."""
        seen = self._seen()
        drafted: list[int] = []
        for i in range(k + 1):
            token, _ = draft_token(logits, self._sampling, seen, None)
            drafted.append(token)
            if seen is not None:
                seen[token] = True
            if i < k:
                logits = self._feed(token)
        text = appended_text(self.draft_codec, self._tokens.ids, drafted)
        tokens = stable_target_tokens(self.target_codec, context, text, k)
        return DraftProposal(torch.tensor(tokens, dtype=torch.long), None)

    def _propose_intersection(self, logits: torch.Tensor, k: int, start: int) -> DraftProposal:
        """TLI: each token drawn from the drafter's processed distribution restricted to the shared
        tokens, and that exact row reported in the target's vocabulary; the chain stops where the
        restriction has no mass. Token i is a target token at position start + i, drawn with that
        position's noise where the generator is position-keyed (coupled verification)."""
        seen = self._seen()
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            probs = logits_to_probs(logits[None], self._sampling, None if seen is None else seen[None])[0]  # [Vd]
            row = self.vocabulary.restrict(probs)  # [Vt]
            if row is None:
                break
            token = sample(row, self._generator, start + i)  # drawn from the very row reported
            tokens.append(token)
            rows.append(row)
            own = self.vocabulary.draft_id(token)  # the same string: the drafter continues in its own ids
            if seen is not None:
                seen[own] = True
            if i + 1 < k:
                logits = self._feed(own)
        if not tokens:
            return DraftProposal.empty()
        return DraftProposal(torch.tensor(tokens, dtype=torch.long), torch.stack(rows))  # [k', Vt]


def check_cross_vocab_settings(ctx: DrafterContext, target_name: str, draft_name: str) -> None:
    """Refuse what a drafter with another vocabulary cannot do, before its weights are read. (Trees: it
    has no propose_tree, so the engine refuses them; the drafter is shared by configurations that differ
    in tree settings, which are not drafter settings.)"""
    why = f"drafter {draft_name!r} has another tokenizer than target {target_name!r}"
    if int(ctx.options.get("vocab") or 0) > 0:
        raise ConfigError("draft_vocab", f"draft_vocab needs a draft model sharing the target's tokenizer ({why}); "
                                         "drop draft_vocab", ctx.options.get("vocab"))


def cross_vocab_drafter(ctx: DrafterContext, runner: ModelRunner, draft_tokenizer, target_name: str,
                        draft_name: str) -> CrossVocabDrafter:
    """The drafter for a draft model with another tokenizer (both tokenizers are needed for the text)."""
    check_cross_vocab_settings(ctx, target_name, draft_name)
    vocabulary = VocabularyMap.from_tokenizers(ctx.target.tokenizer, draft_tokenizer, ctx.vocab_size,
                                               runner.vocab_size)
    return CrossVocabDrafter(runner, vocabulary, TokenizerCodec(ctx.target.tokenizer),
                             TokenizerCodec(draft_tokenizer))
