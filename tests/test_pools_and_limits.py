"""The decoder's drafter pool and the server's client share, as plain objects (no model, no server)."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from specwise.drafters.pool import DrafterPool
from specwise.server.errors import quoted, shown, without_paths
from specwise.server.limits import ClientShare


class _Drafter:
    def __init__(self, key) -> None:
        self.key = key


def test_the_pool_keeps_the_most_recently_used_idle_drafters_within_its_bound():
    pool = DrafterPool(idle_limit=4)
    made = {key: pool.shared(key, lambda key=key: _Drafter(key)) for key in range(10)}
    assert sorted(d.key for d in pool.drafters()) == [6, 7, 8, 9]
    assert pool.shared(9, lambda: _Drafter("again")) is made[9]  # kept: the same drafter
    assert pool.shared(6, lambda: _Drafter("again")) is made[6]  # used now: the most recent
    again = pool.shared(0, lambda: _Drafter("again"))  # dropped: made anew
    assert again is not made[0] and again.key == "again"
    assert sorted(str(d.key) for d in pool.drafters()) == ["6", "8", "9", "again"]  # 7 was the least recent


def test_a_borrowed_drafter_is_never_dropped_and_serves_the_next_generation():
    pool = DrafterPool(idle_limit=2)
    with ExitStack() as stack:
        lent = [stack.enter_context(pool.borrowed("k", lambda: _Drafter("k"))) for _ in range(5)]
        assert len({id(d) for d in lent}) == 5  # one drafter per generation running at once
        for key in range(5):  # other keys come and go meanwhile
            with pool.borrowed(key, lambda key=key: _Drafter(key)):
                pass
        assert all(any(d is held for held in pool.drafters()) for d in lent)  # in use: kept
    assert pool.idle == 2
    kept = pool.drafters()
    with pool.borrowed("k", lambda: _Drafter("new")) as drafter:
        assert any(drafter is d for d in kept)  # an idle one of the key is taken again
    with pytest.raises(ValueError, match="idle_limit"):
        DrafterPool(idle_limit=0)


@dataclass
class _Job:
    client: str
    tokens: int


def test_a_client_past_its_share_waits_only_while_another_client_does():
    share = ClientShare(0.5, workers=4, max_queue=4, kv_budget_tokens=100)
    assert (share.kv_tokens, share.workers, share.waiting) == (50, 2, 2)
    held = [_Job("greedy", 40)]
    mine, theirs = _Job("greedy", 40), _Job("small", 5)
    assert not share.over_share(mine, held, [mine])  # nobody else waits: the whole server is its
    assert share.over_share(mine, held, [mine, theirs])  # 80 of 100 while the other waits: passed over
    assert not share.over_share(theirs, held, [mine, theirs])
    assert not share.over_share(_Job("greedy", 90), [], [theirs])  # holding nothing, it may always start one
    line = [_Job("greedy", 1), _Job("greedy", 1)]
    assert share.may_wait(line[1], line) and not share.may_wait(_Job("greedy", 1), line + [_Job("greedy", 1)])
    assert share.may_wait(theirs, line + [theirs])
    everyone = ClientShare(1.0, workers=4, max_queue=4, kv_budget_tokens=100)
    assert not everyone.over_share(mine, held * 3, [mine, theirs]) and everyone.may_wait(mine, [mine] * 9)


def test_messages_show_values_by_kind_and_no_server_path():
    assert shown(3) == "3" and shown(None) == "null" and shown(True) == "true"
    assert shown("<script>" * 100) == "a string of 800 characters"
    assert shown(10 ** 100).startswith("an integer of") and shown([1, 2]) == "a list of 2 items"
    assert quoted("ngram") == "'ngram'" and quoted("a b\n") == "a string of 4 characters"
    assert without_paths("no head in /root/.cache/specwise/heads/x; train one") == \
        "no head in <a path on the server>; train one"
    assert without_paths("prompt token ids must be in [0, 100)") == "prompt token ids must be in [0, 100)"
