"""The operator's limits on what one request may ask and what one client may hold.

`ServerLimits` gathers them (each `specwise serve` flag has its field here); the
app checks a request's speculation against them (`check_speculation`) after the
declared ranges (specwise.settings) have passed, and the scheduler keeps each
client to its share (`ClientShare`) while another client waits.

Why a simple cap rather than weighted fair queueing: a cap needs no weights to
configure and its guarantee is easy to state. While any other client's request
waits, a client is admitted nothing that would take it past `share` of the KV
budget or of the workers (a client holding nothing may always start one job),
and no client may hold more than `share` of the waiting line; so with the
default half, another client's request always finds a place in line and is
admitted as soon as its tokens fit in what the greedy client leaves. When nobody
else waits, a client may use the whole server (the cap is work-conserving).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from specwise.config import SpecConfig

DEFAULT_MAX_DRAFT_TOKENS = 32
DEFAULT_CLIENT_SHARE = 0.5
DEFAULT_BODY_TIMEOUT = 60.0
DEFAULT_MAX_CONNECTIONS = 256


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask and one client may hold.

    max_draft_tokens: the most draft tokens one step of a request may score: k for a chain,
        k_max for adaptive drafting (the larger of k and k_max for adaptive "auto", which keeps
        k for some requests), the nodes of a tree (--max-draft-tokens).
    client_share: the fraction of the KV budget, of the workers and of the waiting line one
        client (API key; without keys, bearer token and `user`) may hold while another
        client's request waits (--client-share; 1 = first come, first served).
    body_timeout: seconds a request's whole body may take to arrive (--body-timeout).
    """

    max_draft_tokens: int = DEFAULT_MAX_DRAFT_TOKENS
    client_share: float = DEFAULT_CLIENT_SHARE
    body_timeout: float = DEFAULT_BODY_TIMEOUT

    def __post_init__(self) -> None:
        problems = limit_problems(self.max_draft_tokens, self.client_share, self.body_timeout)
        if problems:
            raise ValueError(problems[0])


def limit_problems(max_draft_tokens: Any, client_share: Any, body_timeout: Any) -> list[str]:
    """What is wrong with these limits, each naming its flag and the allowed values."""
    problems = []
    if not isinstance(max_draft_tokens, int) or isinstance(max_draft_tokens, bool) or max_draft_tokens < 1:
        problems.append(f"--max-draft-tokens must be an integer >= 1; got {max_draft_tokens!r}")
    if not isinstance(client_share, (int, float)) or not 0 < client_share <= 1:
        problems.append(f"--client-share must be a fraction in (0, 1]; got {client_share!r}")
    if not isinstance(body_timeout, (int, float)) or not 0 < body_timeout < math.inf:
        problems.append(f"--body-timeout must be a number of seconds > 0; got {body_timeout!r}")
    return problems


def draft_tokens(spec: SpecConfig) -> tuple[str, int]:
    """(the setting that sizes a step's draft, the draft tokens it asks for a step)."""
    if spec.drafter == "none":
        return "k", 0
    if spec.tree:
        return ("tree_shape" if spec.tree_shape else "tree_nodes"), spec.tree_nodes
    if spec.adaptive is True:
        return "k_max", spec.k_max
    if spec.adaptive is not False and spec.k_max >= spec.k:  # "auto": k_max, or k for a seeded sampled request
        return "k_max", spec.k_max
    return "k", spec.k


def check_speculation(spec: SpecConfig, limits: ServerLimits) -> None:
    """Refuse (400 naming the setting) a draft larger than the operator allows a step."""
    from specwise.server.errors import bad_request  # FastAPI's: the CLI imports this module without it

    name, tokens = draft_tokens(spec)
    if tokens > limits.max_draft_tokens:
        raise bad_request(f"speculative.{name} asks for {tokens} draft tokens a step; this server allows at most "
                          f"{limits.max_draft_tokens} (--max-draft-tokens); ask for fewer",
                          f"speculative.{name}", "draft_limit_exceeded")


def check_operator_spec(spec: SpecConfig, limits: ServerLimits, where: str) -> None:
    """Raise ValueError when the server's own speculation is beyond its own limit."""
    name, tokens = draft_tokens(spec)
    if tokens > limits.max_draft_tokens:
        raise ValueError(f"{where} drafts {tokens} tokens a step ({name}), more than max_draft_tokens="
                         f"{limits.max_draft_tokens}; raise --max-draft-tokens or draft fewer")


class _Held(Protocol):
    client: str
    tokens: int


class ClientShare:
    """Which waiting jobs a client's share lets in (the scheduler asks it, holding its lock)."""

    def __init__(self, share: float, workers: int, max_queue: int, kv_budget_tokens: int | None) -> None:
        self.share = share
        self.kv_tokens = None if kv_budget_tokens is None else max(1, math.floor(share * kv_budget_tokens))
        self.workers = max(1, math.floor(share * workers))
        self.waiting = max(1, math.floor(share * max_queue)) if max_queue else 0

    def may_wait(self, job: _Held, waiting: Iterable[_Held]) -> bool:
        """Whether the job may take a place in line beside the client's other waiting jobs."""
        if self.share >= 1:
            return True
        return sum(1 for other in waiting if other.client == job.client) <= self.waiting

    def over_share(self, job: _Held, active: Iterable[_Held], waiting: Iterable[_Held]) -> bool:
        """Whether admitting the job would take its client past its share while another client's
        job waits (a client holding nothing may always start one job, however large)."""
        if self.share >= 1 or not any(other.client != job.client for other in waiting):
            return False
        held = [other for other in active if other.client == job.client]
        if not held:
            return False
        return len(held) + 1 > self.workers or (self.kv_tokens is not None
                                                and sum(other.tokens for other in held) + job.tokens > self.kv_tokens)


def longest_token_chars(tokenizer: Any) -> int | None:
    """The most characters of text one token can stand for (None: no tokenizer to ask).

    A token's string in the vocabulary has at least as many characters as the text it stands for
    (byte-level tokens are one character a byte, and a character is at least one byte)."""
    vocab = tokenizer.get_vocab() if tokenizer is not None and hasattr(tokenizer, "get_vocab") else None
    return max(1, max(len(token) for token in vocab)) if vocab else None


def prompt_chars_limit(max_context: int, longest_chars: int | None) -> int | None:
    """The most characters of prompt that may fit in a context window: a longer one is refused before
    it is tokenized. Twice the tight bound, for normalizers that merge characters (NFC)."""
    return None if longest_chars is None else 2 * max_context * longest_chars
