"""A socket's remembered responses: the O(1) steady state against the plain scan."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.frontends.ws_queue import QueueBudget
from streamer.frontends.ws_session import SessionRules


def plain_remember(remembered: OrderedDict[str, Any], limit: int, rid: str, lane: Any) -> None:
    """The rule as first written: forget the oldest that are not their lane's latest."""
    remembered[rid] = (lane, [])
    over = len(remembered) - limit
    if over <= 0:
        return
    latest = {owner: r for r, (owner, _) in remembered.items()}
    spare = set(latest.values())
    for r in [r for r in remembered if r not in spare][:over]:
        del remembered[r]
        over -= 1
    while over > 0:
        remembered.popitem(last=False)
        over -= 1


steps = st.lists(
    st.tuples(
        st.sampled_from(["remember", "recall"]),
        st.sampled_from([None, "a", "b"]),
        st.integers(0, 30),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5), steps)
def test_remember_forgets_what_the_plain_rule_forgets(limit: int, ops: list[Any]) -> None:
    rules = SessionRules(QueueBudget(1 << 20, 100, 3), limit)
    plain: OrderedDict[str, Any] = OrderedDict()
    for op, lane, n in ops:
        rid = f"resp_{n}"
        if op == "remember":
            rules.remember(rid, lane, [])
            plain_remember(plain, rules.remember_limit, rid, lane)
        else:
            assert (rules.recall(rid) is None) == (rid not in plain)
            if rid in plain:
                plain.move_to_end(rid)
        assert [(r, o) for r, (o, _) in rules.remembered.items()] == [
            (r, o) for r, (o, _) in plain.items()
        ]
