"""Whether a draft model drafts in the target's own token ids, and what must hold when it does.

The drafter proposes token ids and the target scores them, so a drafter whose id 17 is another
token than the target's id 17 cannot propose its own ids. The tokenizers are compared id by id,
before the draft model's weights are read: where they agree, the draft model drafts in the
target's ids (DraftModelDrafter); where they differ, the draft-model factory converts its drafts
(specwise.drafters.cross_vocab: through text when greedy, through the tokens both vocabularies
share when sampling). Without both tokenizers nothing says what the ids mean and no text can be
made of them, so the widths must then be equal.

The two models' output layers may still differ in width. Models pad their embedding past the
tokenizer for faster matrix shapes: Qwen2.5 has 151,665 tokens in 151,936 rows up to 3B and in
152,064 rows from 7B on, and a GGUF file lists the padding rows as placeholder tokens named
`[PAD<id>]`. Padding is allowed: the tokens compared are each tokenizer's
tokens without a final run of placeholders, the drafter's embedding must hold a row for every
token the target reads (its context is the target's tokens), and the drafter's logits are cut
or padded to the target's width (DraftModelDrafter._fit_width).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# The drafters that need no draft model, so pair with any target.
MODEL_FREE_DRAFTERS = ("ngram", "suffix")
_PADDING = re.compile(r"\[PAD\d+\]")


class VocabularyMismatchError(ValueError):
    """The drafter's tokens do not mean the same strings as the target's."""


def _what_works() -> str:
    return (f"a drafter drafting in the target's ids must share the target's tokenizer: pick one from the same "
            f"model family, or use a drafter that needs no draft model ({', '.join(MODEL_FREE_DRAFTERS)}; or "
            f"none: plain decoding)")


def _without_tokenizer() -> str:
    return ("give both models their tokenizers (a draft model with another vocabulary then drafts through "
            f"text), or use a drafter that needs no draft model ({', '.join(MODEL_FREE_DRAFTERS)}; or none: "
            "plain decoding)")


def real_tokens(tokenizer) -> list[str | None]:
    """The tokenizer's tokens by id (None for an id it has no token for), without the padding
    placeholders at the end."""
    vocab = tokenizer.get_vocab()
    tokens: list[str | None] = [None] * (max(vocab.values(), default=-1) + 1)
    for token, index in vocab.items():
        tokens[index] = token
    end = len(tokens)
    while end and (tokens[end - 1] is None or _PADDING.fullmatch(tokens[end - 1])):
        end -= 1
    return tokens[:end]


def _first_difference(a: Sequence, b: Sequence) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def same_vocabulary(target_tokenizer, draft_tokenizer) -> bool:
    """Whether both tokenizers map every id to the same token (padding placeholders at the end aside);
    True when either is missing, as then there is nothing to compare."""
    if target_tokenizer is None or draft_tokenizer is None:
        return True
    return real_tokens(target_tokenizer) == real_tokens(draft_tokenizer)


def check_same_vocabulary(target_tokenizer, draft_tokenizer, target_name: str, draft_name: str) -> None:
    """Refuse a drafter whose tokenizer maps any id to another token than the target's (padding
    placeholders past the real tokens aside); nothing to compare when either has no tokenizer."""
    if target_tokenizer is None or draft_tokenizer is None:
        return
    target, draft = real_tokens(target_tokenizer), real_tokens(draft_tokenizer)
    if target != draft:
        at = _first_difference(target, draft)
        theirs = draft[at] if at < len(draft) else "(none)"
        ours = target[at] if at < len(target) else "(none)"
        raise VocabularyMismatchError(
            f"drafter {draft_name!r} has a different vocabulary from target {target_name!r} ({len(draft)} vs "
            f"{len(target)} tokens; the first difference is id {at}: {theirs!r} vs {ours!r}); {_what_works()}")


def check_pairing(target_tokenizer, target_width: int, draft_tokenizer, draft_width: int,
                  target_name: str, draft_name: str) -> None:
    """Refuse a draft model that cannot draft in the target's ids: another vocabulary, or an embedding
    too narrow for a token the target reads. Widths may differ by padding rows; without both
    tokenizers the widths must be equal, as nothing else says the ids agree."""
    if target_tokenizer is None or draft_tokenizer is None:
        if draft_width != target_width:
            missing = " and the ".join(name for name, tokenizer in (("target", target_tokenizer),
                                                                    ("drafter", draft_tokenizer)) if tokenizer is None)
            raise VocabularyMismatchError(
                f"drafter {draft_name!r} has {draft_width} output tokens but target {target_name!r} has "
                f"{target_width}, and without a tokenizer (the {missing}) nothing says what the ids mean; "
                f"{_without_tokenizer()}")
        return
    check_same_vocabulary(target_tokenizer, draft_tokenizer, target_name, draft_name)
    # Every real token the target reads reaches the drafter as context, so it needs a row for it.
    needed = min(target_width, len(real_tokens(target_tokenizer)))
    if draft_width < needed:
        raise VocabularyMismatchError(f"drafter {draft_name!r} has {draft_width} embedding rows, fewer than the "
                                      f"{needed} tokens target {target_name!r} reads; {_what_works()}")
