"""A suffix trie of bounded depth with occurrence counts, updated one token at a time.

The trie holds every substring of its sequences up to `depth` tokens; a node's count
is the number of occurrences (sequence, start) whose first tokens spell its path.
Sequences grow at their end (`extend`) and leave whole (`remove`), so the current
request is indexed as it is committed and earlier requests can be evicted oldest first.

Why leaves: a plain trie of depth D makes up to D nodes per token. Here a path taken
by a single occurrence is one *leaf* that points at that occurrence (its count is 1);
the tokens below it are read from the sequence itself, and grow with it. A leaf is
split ("burst") one level when a second occurrence enters it. Non-repetitive text then
costs a few nodes per token; repeated text shares its nodes.

Nodes live in parallel lists indexed by node id (a dict per internal node for its
children), which keeps a node at ~100 bytes and the updates to a few dict operations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ROOT = 0
_SHIFT = 32  # an occurrence id is sequence id << _SHIFT | start


@dataclass(frozen=True)
class Cursor:
    """A position in the trie: the end of a path of `depth` tokens. `node` is the deepest
    node on the path; when it is a leaf, the path may continue `depth - level` tokens into
    the leaf's occurrence."""

    node: int
    depth: int


class SuffixTrie:
    """Every substring of up to `depth` tokens of the sequences it holds, with counts."""

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1; got {depth}")
        self.depth = depth
        self._kids: list[dict[int, int] | None] = [{}]  # None marks a leaf
        self._count: list[int] = [0]
        self._level: list[int] = [0]
        self._owner: list[int] = [-1]  # a leaf's occurrence id
        self._free: list[int] = []
        self._seqs: dict[int, list[int]] = {}
        self._open: dict[int, dict[int, int]] = {}  # open sequence -> {start: deepest node} of suffixes < depth
        self._next_id = 0
        self.tokens = 0  # tokens held, over all sequences

    # ------------------------------------------------------------------ size

    @property
    def nodes(self) -> int:
        return len(self._count) - len(self._free)

    @property
    def sequences(self) -> int:
        return len(self._seqs)

    # ------------------------------------------------------------------ updates

    def open(self) -> int:
        """A new, empty sequence to `extend`; returns its id."""
        sid = self._next_id
        self._next_id += 1
        self._seqs[sid] = []
        self._open[sid] = {}
        return sid

    def close(self, sid: int) -> None:
        """No more tokens for this sequence (it stays indexed until `remove`)."""
        self._open.pop(sid, None)

    def add(self, tokens: Iterable[int]) -> int:
        """Index a whole sequence; returns its id."""
        sid = self.open()
        self.extend(sid, tokens)
        self.close(sid)
        return sid

    def extend(self, sid: int, tokens: Iterable[int]) -> None:
        """Append tokens to an open sequence, indexing the suffixes each one extends."""
        seq, ends = self._seqs[sid], self._open[sid]
        kids, count = self._kids, self._count
        depth = self.depth
        for token in tokens:
            token = int(token)
            i = len(seq)
            seq.append(token)
            self.tokens += 1
            ends[i] = ROOT  # the suffix starting here
            count[ROOT] += 1
            # Oldest suffix first, reading each one's node afresh: stepping into another
            # suffix's leaf bursts it and moves that suffix's end.
            for start in list(ends):
                node = ends[start]
                if kids[node] is None:
                    pass  # a leaf: the suffix is its single occurrence and grows with it
                else:  # the suffix ends exactly at an internal node: step into child `token`
                    level = i - start + 1
                    child = kids[node].get(token)
                    if child is None:
                        child = self._new_node(level, None, 1, (sid << _SHIFT) | start)
                        kids[node][token] = child
                    else:
                        if kids[child] is None:
                            self._burst(child)
                        count[child] += 1
                    ends[start] = child
                if i - start + 1 >= depth:
                    del ends[start]

    def remove(self, sid: int) -> None:
        """Forget a sequence: take its occurrences' counts back, drop nodes left at 0."""
        seq = self._seqs.pop(sid)
        self._open.pop(sid, None)
        kids, count = self._kids, self._count
        for start in range(len(seq)):
            count[ROOT] -= 1
            node = ROOT
            for level in range(1, min(self.depth, len(seq) - start) + 1):
                child = kids[node][seq[start + level - 1]]
                count[child] -= 1
                if count[child] == 0:
                    del kids[node][seq[start + level - 1]]
                    self._free_subtree(child)
                    break
                if kids[child] is None:
                    raise AssertionError("a leaf with count > 1")  # leaves stand for one occurrence
                node = child
        self.tokens -= len(seq)

    def _new_node(self, level: int, kids: dict[int, int] | None, count: int, owner: int) -> int:
        if self._free:
            node = self._free.pop()
            self._kids[node], self._count[node], self._level[node], self._owner[node] = kids, count, level, owner
        else:
            node = len(self._count)
            self._kids.append(kids)
            self._count.append(count)
            self._level.append(level)
            self._owner.append(owner)
        return node

    def _burst(self, leaf: int) -> None:
        """Make a leaf internal: its occurrence continues in a new leaf one level down."""
        occurrence = self._owner[leaf]
        sid, start = occurrence >> _SHIFT, occurrence & ((1 << _SHIFT) - 1)
        seq, level = self._seqs[sid], self._level[leaf]
        self._kids[leaf], self._owner[leaf] = {}, -1
        below = leaf
        if level < self.depth and start + level < len(seq):
            below = self._new_node(level + 1, None, 1, occurrence)
            self._kids[leaf][seq[start + level]] = below
        ends = self._open.get(sid)
        if ends is not None and ends.get(start) == leaf:
            ends[start] = below

    def _free_subtree(self, node: int) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            if self._kids[n]:
                stack.extend(self._kids[n].values())
            self._kids[n], self._owner[n] = None, -1
            self._free.append(n)

    # ------------------------------------------------------------------ lookups

    def _leaf_token(self, node: int, depth: int) -> int | None:
        """The token after `depth` tokens of a leaf's occurrence, or None where it ends."""
        occurrence = self._owner[node]
        seq = self._seqs[occurrence >> _SHIFT]
        position = (occurrence & ((1 << _SHIFT) - 1)) + depth
        return seq[position] if depth < self.depth and position < len(seq) else None

    def step(self, cursor: Cursor, token: int) -> Cursor | None:
        """The cursor one token further, or None where no occurrence continues with it."""
        kids = self._kids[cursor.node]
        if kids is None:
            return Cursor(cursor.node, cursor.depth + 1) if self._leaf_token(cursor.node, cursor.depth) == token \
                else None
        child = kids.get(token)
        return None if child is None else Cursor(child, cursor.depth + 1)

    def find(self, path: Sequence[int]) -> Cursor | None:
        """The cursor at the end of `path`, or None where it does not occur (or is too long)."""
        if len(path) > self.depth:
            return None
        cursor: Cursor | None = Cursor(ROOT, 0)
        for token in path:
            cursor = self.step(cursor, int(token))
            if cursor is None:
                return None
        return cursor

    def count(self, cursor: Cursor) -> int:
        return 1 if self._kids[cursor.node] is None else self._count[cursor.node]

    def children(self, cursor: Cursor) -> dict[int, int]:
        """{next token: occurrences that continue with it} after the cursor's path."""
        kids = self._kids[cursor.node]
        if kids is None:
            token = self._leaf_token(cursor.node, cursor.depth)
            return {} if token is None else {token: 1}
        count = self._count
        return {token: count[child] for token, child in kids.items()}

    def has_children(self, cursor: Cursor) -> bool:
        kids = self._kids[cursor.node]
        return bool(kids) if kids is not None else self._leaf_token(cursor.node, cursor.depth) is not None

    def counts(self) -> dict[tuple[int, ...], int]:
        """Every path held and its count, leaves spelled out (for tests: compare with a rebuild)."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[Cursor, tuple[int, ...]]] = [(Cursor(ROOT, 0), ())]
        while stack:
            cursor, path = stack.pop()
            for token, n in self.children(cursor).items():
                out[path + (token,)] = n
                stack.append((self.step(cursor, token), path + (token,)))
        return out
