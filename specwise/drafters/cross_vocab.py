"""A draft model with another tokenizer than the target's: the vocabulary map and the text between them.

Sampling follows Token-Level Intersection (TLI; Timor et al., ICML 2025, "Accelerating LLM
Inference with Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies"). The
intersection I holds the tokens whose strings are identical in both vocabularies. The drafter
samples each draft token from its own processed distribution restricted to I and renormalized,
and reports exactly that distribution, scattered into the target's vocabulary (zero outside I).
The draft token is then a target token drawn from the reported row, which is all that token-level
or block verification needs to keep the target's distribution exactly (docs/DESIGN.md, the
losslessness contract, point 2). When the drafter puts no mass on I, the chain stops there.

Greedy decoding needs no intersection: the drafter's own argmax tokens become text, and the text
becomes target tokens, of which only the stable ones are proposed (those that re-tokenizing the
committed tail plus the draft text puts after exactly the committed tokens); greedy verification
keeps the target's tokens whatever is proposed.

Both directions go through text incrementally: the committed target tokens are decoded a few at a
time (`CommittedText`), and the drafter's tokens of that text are re-encoded only after an anchor a
few tokens before their end (`DraftTokens`), never the whole conversation per step. The pure parts
take a `TextCodec` (encode / decode without special-token handling of their own), so they can be
tested without real tokenizers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

# A character whose bytes are split across tokens decodes as this until its last byte arrives.
INCOMPLETE = "\ufffd"
# Tokens decoded before the new ones, so that a character split across the boundary decodes whole.
DECODE_TAIL = 4
# The drafter's last tokens re-encoded when the text grows: a new character may merge with them.
ENCODE_WINDOW = 8
# Committed target tokens re-encoded with a draft text, to see where the draft's tokens begin.
TARGET_WINDOW = 8


class TextCodec(Protocol):
    """What the text conversion uses of a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class TokenizerCodec:
    """A Hugging Face tokenizer as a TextCodec: no special tokens added, none skipped (an end of
    turn is text the other model must read too), spaces left as they are."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


@dataclass(frozen=True)
class VocabularyMap:
    """The tokens both vocabularies hold under the same string, by id in each."""

    draft_ids: torch.Tensor  # [n] long: the intersection's ids in the drafter's vocabulary
    target_ids: torch.Tensor  # [n] long: the same tokens' ids in the target's, in the same order
    draft_width: int  # the drafter's logits width
    target_width: int  # the target's logits width: draft rows are this wide
    _draft_of: dict[int, int] = field(repr=False, compare=False, default_factory=dict)

    @staticmethod
    def from_tokens(target_tokens: Sequence[str | None], draft_tokens: Sequence[str | None],
                    target_width: int, draft_width: int) -> "VocabularyMap":
        """tokens: each vocabulary's token strings by id (None: no token at that id). Ids past a
        model's logits width are left out: that model can neither produce nor score them."""
        target_id = {token: i for i, token in enumerate(target_tokens[:target_width]) if token is not None}
        pairs = sorted((target_id[token], d) for d, token in enumerate(draft_tokens[:draft_width])
                       if token is not None and token in target_id)
        return VocabularyMap(torch.tensor([d for _, d in pairs], dtype=torch.long),
                             torch.tensor([t for t, _ in pairs], dtype=torch.long),
                             draft_width, target_width, {t: d for t, d in pairs})

    @staticmethod
    def from_tokenizers(target_tokenizer, draft_tokenizer, target_width: int, draft_width: int) -> "VocabularyMap":
        from specwise.drafters.pairing import real_tokens

        return VocabularyMap.from_tokens(real_tokens(target_tokenizer), real_tokens(draft_tokenizer),
                                         target_width, draft_width)

    def __len__(self) -> int:
        return int(self.draft_ids.numel())

    def draft_id(self, target_id: int) -> int:
        """The drafter's id of an intersection token given by its target id."""
        return self._draft_of[target_id]

    def restrict(self, draft_probs: torch.Tensor) -> torch.Tensor | None:
        """TLI's draft row: draft_probs [draft_width] restricted to the intersection and renormalized,
        as a row [target_width] (zero outside the intersection); None when it has no mass there."""
        draft_ids, target_ids = self.draft_ids.to(draft_probs.device), self.target_ids.to(draft_probs.device)
        kept = draft_probs[draft_ids]  # [n]
        mass = kept.sum()
        if not bool(mass > 0):
            return None
        row = draft_probs.new_zeros(self.target_width)  # [target_width]
        row[target_ids] = kept / mass
        return row


@dataclass
class CommittedText:
    """The text of the committed target tokens, extended a few tokens at a time."""

    codec: TextCodec
    ids: list[int] = field(default_factory=list)  # the target tokens whose text is read
    text: str = ""

    def reset(self, ids: Sequence[int]) -> None:
        self.ids, self.text = [], ""
        self.extend(ids)

    def extend(self, context: Sequence[int]) -> bool:
        """Read the tokens of `context` past those read so far; False when there was no new text
        (nothing new, or a character whose last byte has not come yet: read with the next tokens)."""
        read = len(self.ids)
        if len(context) < read or list(context[:read]) != self.ids:  # not a continuation: read it anew
            self.ids, self.text, read = [], "", 0
        if len(context) == read:
            return False
        start = max(0, read - DECODE_TAIL)
        before = self.codec.decode(context[start:read])
        after = self.codec.decode(context[start:])
        if after.endswith(INCOMPLETE) or not after.startswith(before):
            return False
        self.ids = list(context)
        self.text += after[len(before):]
        return True


@dataclass
class DraftTokens:
    """The drafter's tokens of the committed text. ids[:anchor_ids] is the drafter's tokenization of
    text[:anchor_chars]; when the text grows, only the rest is encoded again, so a new character
    can still merge with the last few tokens without the whole text being encoded each step."""

    codec: TextCodec
    ids: list[int] = field(default_factory=list)
    text: str = ""
    anchor_ids: int = 0
    anchor_chars: int = 0

    def reset(self, text: str) -> None:
        self.ids, self.text, self.anchor_ids, self.anchor_chars = [], "", 0, 0
        self.extend(text)

    def extend(self, text: str) -> None:
        """Take the committed text (the previous one extended)."""
        if not text.startswith(self.text):
            self.ids, self.anchor_ids, self.anchor_chars = [], 0, 0
        self.ids = self.ids[:self.anchor_ids] + self.codec.encode(text[self.anchor_chars:])
        self.text = text
        self._move_anchor()

    def _move_anchor(self) -> None:
        """Move the anchor to ENCODE_WINDOW tokens before the end, or the first cut after that whose
        tokens decode to exactly the text after it (a cut inside a character or after an unknown
        token does not); the anchor stays where no cut qualifies."""
        for cut in range(max(self.anchor_ids, len(self.ids) - ENCODE_WINDOW), len(self.ids)):
            piece = self.codec.decode(self.ids[cut:])
            if piece and not piece.startswith(INCOMPLETE) and self.text.endswith(piece):
                self.anchor_ids, self.anchor_chars = cut, len(self.text) - len(piece)
                return


def appended_text(codec: TextCodec, context: Sequence[int], new: Sequence[int]) -> str:
    """The text `new` tokens add after `context` (decoded with a few context tokens before them,
    so that a token's leading space or a split character comes out as in the whole text)."""
    tail = list(context[-DECODE_TAIL:])
    before, after = codec.decode(tail), codec.decode(tail + list(new))
    return after[len(before):] if after.startswith(before) else codec.decode(new)


def stable_target_tokens(codec: TextCodec, committed: Sequence[int], draft_text: str, most: int) -> list[int]:
    """The target tokens of `draft_text` after the `committed` ones, at most `most`: the committed
    tail's text plus the draft text is encoded again, and the tokens after the tail are taken only
    when the encoding begins with exactly the tail's tokens (else the draft would merge with
    committed text, and nothing is proposed). The last token is left out: text after it could
    still merge with it."""
    start = max(0, len(committed) - TARGET_WINDOW)
    head = codec.decode(committed[start:])
    while start > 0 and head.startswith(INCOMPLETE) and start > len(committed) - 2 * TARGET_WINDOW:
        start -= 1  # the window began inside a character
        head = codec.decode(committed[start:])
    window = list(committed[start:])
    ids = codec.encode(head + draft_text)
    if ids[:len(window)] != window:
        return []
    return ids[len(window):-1][:most]
