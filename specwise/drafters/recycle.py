"""Token Recycling (Luo et al., arXiv 2408.08696): drafts from the target's own earlier candidates.

Every scoring pass computes the target's next-token logits after each token it was fed, and
verification keeps one token per position: the runners-up are thrown away. This drafter keeps
them. For each token id it remembers the target's `candidates` most likely successors, seen the
last time that token was fed to the target (an adjacency table, [vocab, candidates] ids, a few MB),
and drafts by walking the table from the context's last token: the first candidate of each token
for a chain, the first few of each for a tree. Rejected draft tokens teach the table too: the
target scored them as well.

Alone it drafts open-ended text where prompt lookup finds nothing. Combined with retrieval
(SAM-Decoding, Hu et al., arXiv 2411.10666) it uses the n-gram or suffix drafter's draft where that
one matches at least `MIN_MATCH` tokens of the context's end, continued by the table where the
retrieved draft stops short of k, and the table's draft otherwise.

Drafts are chosen deterministically from the table: point masses (probs None), verified as the
n-gram drafter's are. The table is what the target predicted, so it learns only from scoring
passes; the engine hands them over (`ScoreReader`). Tables are kept per sharing scope like the
suffix drafter's memory of earlier requests (a tenant never drafts from another's text), at most
`MAX_TABLES` of them per decoder, least recently used dropped.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from specwise.config import SamplingParams
from specwise.drafters.base import (DraftProposal, DrafterContext, RetrievalDrafter, TreeProposal, create_drafter,
                                    register_drafter)
from specwise.drafters.scope import Scope, current_scope
from specwise.verify.result import VerifyResult

# Retrieval's draft is preferred when it matched at least this many tokens of the context's end: a
# one-token match is a guess that follows the commonest tokens of the text, where the target's own
# candidates know better.
MIN_MATCH = 2
# Tables one decoder keeps (one per sharing scope): for a 152k vocabulary and 8 candidates, 4.9 MB each.
MAX_TABLES = 16
_UNKNOWN = -1


class RecycleTable:
    """For each token id, the target's most likely successors the last time it scored that token."""

    def __init__(self, vocab_size: int, candidates: int) -> None:
        if candidates < 1:
            raise ValueError(f"recycle_candidates must be >= 1; got {candidates}")
        self.vocab_size, self.candidates = vocab_size, candidates
        self.successors = torch.full((vocab_size, candidates), _UNKNOWN, dtype=torch.int32)  # [V, m]

    def learn(self, fed: Sequence[int], top: torch.Tensor) -> None:
        """fed: the ids of one pass; top [len(fed), m] int: the target's best next ids after each.
        A token fed twice in one pass keeps its later row."""
        self.successors[torch.as_tensor(list(fed), dtype=torch.long)] = top.to(torch.int32)

    def next_of(self, token: int) -> list[int]:
        """The known successors of `token`, best first."""
        return [t for t in self.successors[token].tolist() if t != _UNKNOWN]

    def chain(self, token: int, k: int) -> list[int]:
        """Up to k tokens, each the first candidate after the one before."""
        tokens: list[int] = []
        while len(tokens) < k:
            token = int(self.successors[token, 0])
            if token == _UNKNOWN:
                break
            tokens.append(token)
        return tokens

    def tree(self, token: int, limits: Sequence[int], nodes: int) -> tuple[list[int], list[int]]:
        """Breadth first from `token`: at level l each node's first limits[l] distinct candidates,
        at most `nodes` nodes. Returns (tokens, parents) in verify_tree's order."""
        tokens: list[int] = []
        parents: list[int] = []
        level_nodes = [(-1, token)]
        for limit in limits:
            below: list[tuple[int, int]] = []
            for parent, at in level_nodes:
                for child in self.next_of(at)[:limit]:
                    if len(tokens) >= nodes:
                        return tokens, parents
                    tokens.append(child)
                    parents.append(parent)
                    below.append((len(tokens) - 1, child))
            if not below:
                break
            level_nodes = below
        return tokens, parents


class RecycleTables:
    """One decoder's tables, one per sharing scope (None: a generation's own, never shared)."""

    def __init__(self, vocab_size: int, candidates: int, max_tables: int = MAX_TABLES) -> None:
        self.vocab_size, self.candidates, self.max_tables = vocab_size, candidates, max_tables
        self._tables: OrderedDict[Scope, RecycleTable] = OrderedDict()
        self._lock = threading.Lock()

    def table(self, scope: Scope) -> RecycleTable:
        if scope is None:
            return RecycleTable(self.vocab_size, self.candidates)
        with self._lock:
            table = self._tables.pop(scope, None) or RecycleTable(self.vocab_size, self.candidates)
            self._tables[scope] = table  # most recently used last
            while len(self._tables) > self.max_tables:
                self._tables.popitem(last=False)
            return table

    def __len__(self) -> int:
        return len(self._tables)


class RecycleDrafter:
    """Drafts from the target's earlier candidates, alone or after a retrieval drafter (point masses)."""

    free_drafts = True  # cheap point masses: adaptive k may take shadow drafts (FreeDrafter)
    name = "recycle"
    remembers_requests = True  # earlier generations stay in its memory (RememberingDrafter)

    def __init__(self, tables: RecycleTables, retrieval: RetrievalDrafter | None = None,
                 min_match: int = MIN_MATCH) -> None:
        self.tables = tables
        self.retrieval = retrieval
        self.min_match = min_match
        self._table = tables.table(())

    # ------------------------------------------------------------------ protocol

    def start(self, prompt_ids: Sequence[int], sampling: SamplingParams,
              generator: torch.Generator) -> None:
        self._table = self.tables.table(current_scope())
        if self.retrieval is not None:
            self.retrieval.start(prompt_ids, sampling, generator)

    def observe(self, result: VerifyResult) -> None:
        if self.retrieval is not None:
            self.retrieval.observe(result)

    def read_scores(self, fed: Sequence[int], logits: torch.Tensor) -> None:
        """A scoring pass: logits [len(fed), V], row i the target's logits after fed[i]."""
        width = min(self.tables.candidates, logits.shape[-1])
        top = torch.topk(logits[..., :self.tables.vocab_size], width, dim=-1).indices  # [len(fed), m]
        self._table.learn(fed, top)

    def propose(self, context: Sequence[int], k: int) -> DraftProposal:
        if k <= 0:
            return DraftProposal.empty()
        tokens = self._retrieved(context, k)
        last = tokens[-1] if tokens else int(context[-1])
        tokens += self._table.chain(last, k - len(tokens))
        return DraftProposal(torch.tensor(tokens, dtype=torch.long), None)

    def propose_tree(self, context: Sequence[int], nodes: int, depth: int, branching: int,
                     shape: Sequence[int] | None = None) -> TreeProposal:
        """Retrieval's tree where it matches well, else the table's (breadth first, the first
        `branching` candidates of each node, or a fixed shape's children per level)."""
        if nodes <= 0 or depth <= 0:
            return TreeProposal.empty()
        if self.retrieval is not None and self._match(context) >= self.min_match:
            tree = self.retrieval.propose_tree(context, nodes, depth, branching, shape=shape)
            if len(tree):
                return tree
        limits = list(shape) if shape is not None else [branching] * depth
        tokens, parents = self._table.tree(int(context[-1]), limits[:depth], nodes)
        return TreeProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), None)

    # ------------------------------------------------------------------ retrieval

    def _retrieved(self, context: Sequence[int], k: int) -> list[int]:
        """Retrieval's draft where it matched at least min_match tokens, else nothing."""
        if self.retrieval is None or self._match(context) < self.min_match:
            return []
        return self.retrieval.propose(context, k).tokens.tolist()

    def _match(self, context: Sequence[int]) -> int:
        """How many tokens of the context's end retrieval matched earlier (0: none)."""
        return 0 if self.retrieval is None else self.retrieval.match_length(context)


RETRIEVAL = ("none", "ngram", "suffix")


def _factory(ctx: DrafterContext) -> RecycleDrafter:
    spec = ctx.spec
    candidates = int(ctx.options.get("candidates", spec.recycle_candidates))
    with_ = ctx.options.get("with", spec.recycle_with)
    if with_ not in RETRIEVAL:
        raise ValueError(f"recycle_with must be one of {', '.join(RETRIEVAL)}; got {with_!r}")
    key = ("recycle-tables", candidates)
    tables = (ctx.shared.setdefault(key, RecycleTables(ctx.vocab_size, candidates)) if ctx.shared is not None
              else RecycleTables(ctx.vocab_size, candidates))
    retrieval = None if with_ == "none" else create_drafter(with_, ctx)
    return RecycleDrafter(tables, retrieval)


register_drafter("recycle", _factory)
