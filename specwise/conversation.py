"""A conversation continued turn by turn over one SpecDecoder, reading each turn's new part only.

Every turn's prompt starts with the previous turn's prompt and answer. The decoder's prefix cache
(specwise.prefix_cache) keeps the entries a generation leaves, so turn n finds turn n - 1's prompt
and answer there and reads only what follows (up to one block of 16 tokens before it, where the
last cached block ends).

Two kinds of turn, not mixed in one conversation:
- text: the messages so far go through the tokenizer's chat template each turn; the answer is
  kept as text (what a chat client sends back), so the prefix cache finds the part that encodes
  to the same tokens;
- token ids: the next prompt is exactly the previous prompt, its generated ids and the new ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from specwise.config import SamplingParams, SpecConfig
from specwise.engine import GenerationResult

if TYPE_CHECKING:
    from specwise.api import SpecDecoder


class Conversation:
    """Turns of one chat over a decoder: `send(text or ids)` generates the next answer."""

    def __init__(self, decoder: SpecDecoder, system: str | None = None) -> None:
        self.decoder = decoder
        self.messages: list[dict] = [] if system is None else [{"role": "system", "content": system}]
        self.ids: list[int] = []  # token-id turns: the prompt and answers so far
        self.results: list[GenerationResult] = []

    def send(self, turn: str | Sequence[int], sampling: SamplingParams | None = None, *,
             spec: SpecConfig | None = None) -> GenerationResult:
        """Generate the answer to one more user turn: text (a chat message) or token ids (appended to
        the conversation's ids as they are)."""
        if isinstance(turn, str):
            if self.ids:
                raise ValueError("this conversation continues token ids; send token ids, or start another "
                                 "conversation for text")
            messages = self.messages + [{"role": "user", "content": turn}]
            result = self.decoder.generate(messages, sampling, spec=spec)
            self.messages = messages + [{"role": "assistant", "content": result.text}]
        else:
            if self.messages:
                raise ValueError("this conversation holds chat messages (a system message counts); send text, "
                                 "or start a conversation without a system message for token ids")
            prompt = self.ids + [int(t) for t in turn]
            result = self.decoder.generate(prompt, sampling, spec=spec)
            self.ids = prompt + list(result.token_ids)
        self.results.append(result)
        return result
