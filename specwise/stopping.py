"""Where generation stops, and which text may be shown so far.

A step commits several tokens at once, so a stop (EOS, a stop id, a stop string,
max_new_tokens) can fall inside a block: everything after it is dropped, never
emitted. Text is released as it is decoded, except a tail that could still turn
out to be the start of a stop string or an incomplete UTF-8 character.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenEvent:
    """One committed token, in order.

    text: the text released with this token (possibly "", when it is held back
        while it might start a stop string or is part of a multi-byte character).
    from_draft: True for an accepted draft token, False for the token the target
        chose itself (recovered or bonus).
    """

    token_id: int
    text: str
    from_draft: bool


class StopTracker:
    """Follows the generated tokens, decides when to stop and releases text."""

    def __init__(self, tokenizer, max_new_tokens: int, stop_token_ids: Iterable[int],
                 stop_strings: Sequence[str]) -> None:
        if stop_strings and tokenizer is None:
            raise ValueError("stop_strings need a tokenizer to decode text; pass one or use stop_token_ids")
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = set(stop_token_ids)
        self.stop_strings = tuple(stop_strings)
        self.token_ids: list[int] = []
        self.text = ""  # decoded text, cut before a stop string once one is found
        self.finish_reason: str | None = None
        self._released = 0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.token_ids)

    def push(self, tokens: Sequence[int], num_from_draft: int) -> list[TokenEvent]:
        """Take one step's committed tokens; return the events to emit (nothing past a stop)."""
        events: list[TokenEvent] = []
        for i, token in enumerate(tokens):
            if self.done:
                break
            self.token_ids.append(token)
            if token in self.stop_token_ids:
                self.finish_reason = "stop"
            elif self._decode_and_check_strings():
                self.finish_reason = "stop"
            elif len(self.token_ids) >= self.max_new_tokens:
                self.finish_reason = "length"
            events.append(TokenEvent(token, self._release(), i < num_from_draft))
        return events

    def _decode_and_check_strings(self) -> bool:
        if self.tokenizer is None:
            return False
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if self.stop_strings:
            longest = max(len(s) for s in self.stop_strings)
            start = max(0, len(self.text) - longest)  # a stop string may straddle the last token
            hits = [i for i in (text.find(s, start) for s in self.stop_strings) if i >= 0]
            if hits:
                self.text = text[:min(hits)]
                return True
        self.text = text
        return False

    def _release(self) -> str:
        """Text that can no longer change or turn out to be part of a stop string."""
        end = len(self.text)
        if not self.done:
            while end > self._released and self.text[end - 1] == "\ufffd":
                end -= 1  # an incomplete multi-byte character: wait for its other bytes
            end -= self._stop_prefix_length(self.text[:end])
        if end <= self._released:
            return ""
        delta = self.text[self._released:end]
        self._released = end
        return delta

    def _stop_prefix_length(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stop_strings:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
