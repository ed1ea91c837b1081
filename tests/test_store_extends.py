"""The memory store's shared records against its plain ones (differential).

A record that continues another says so (`StoredResponse.extends`: its first n input items
are that record's, as stored); the memory store then keeps only its new items' bytes and
shares the rest, and lets the earlier record's item ids go to it without walking them. On
random chains and forks of records, some with the hint (or one it cannot use: a record
gone, a count that does not match), some without the earlier output, and random reads,
deletes and item lookups, a store given the hints must answer every call as a store given
none, and hold the same item index (no id left pointing at a deleted record).
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.store import MemoryStore, StoredResponse, with_item_ids


def _item(turn: int, i: int) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": f"c{turn}_{i}", "output": "x" * i}


def _response(rid: str, turn: int) -> dict[str, Any]:
    call = {"type": "function_call", "id": f"fc_{rid}", "call_id": f"o{turn}", "name": "run",
            "arguments": "{}", "status": "completed"}  # fmt: skip
    return {"id": rid, "object": "response", "status": "completed", "output": [call]}


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("turn"),
            st.integers(0, 3),
            st.sampled_from(["right", "none", "wrong", "bare", "steal"]),
        ),
        st.tuples(st.just("delete"), st.integers(0, 20), st.just("")),
        st.tuples(st.just("fork"), st.integers(0, 20), st.integers(0, 3)),
    ),
    max_size=25,
)


async def _apply(stores: list[MemoryStore], ops: list[Any]) -> None:
    records: list[StoredResponse] = []
    for n, (op, a, b) in enumerate(ops):
        if op == "delete" and records:
            rid = records[a % len(records)].id
            assert len({await s.delete(rid) for s in stores}) == 1
            continue
        base = records[a % len(records)] if op == "fork" and records else (records or [None])[-1]
        new = int(b) if op == "fork" else a
        rid = f"resp_{n}"
        bare = op == "turn" and b == "bare"  # the input alone, without the earlier output
        output = [] if base is None or bare else base.response["output"]
        history = [*base.input_items, *output] if base is not None else []
        items = [*history, *with_item_ids([_item(n, i) for i in range(new + 1)])]
        if op == "turn" and b == "steal" and records:  # an item of another record, id and all
            items.append(dict(records[a % len(records)].input_items[0]))
        hint = b if op == "turn" and b not in ("bare", "steal") else "right"
        extends = None
        if base is not None and hint != "none":
            extends = (base.id, len(base.input_items) + (hint == "wrong"))
        plain, hinted = (
            StoredResponse(_response(rid, n), items, "o", extends=e) for e in (None, extends)
        )
        await stores[0].put(plain)
        await stores[1].put(hinted)
        records.append(plain)
        for r in records:
            got = [await s.get(r.id) for s in stores]
            assert got[0] == got[1]
            pages = [await s.input_items(r.id, limit=100) for s in stores]
            assert pages[0] == pages[1]
            for item in [*r.input_items[:3], *r.input_items[-3:], *r.response["output"]]:
                found = [await s.get_item(item["id"]) for s in stores]
                assert found[0] == found[1]
        # the same ids findable, and nothing left behind for the deleted
        assert set(stores[0]._items) == set(stores[1]._items)
        for item_id in stores[0]._items:
            found = [await s.get_item(item_id) for s in stores]
            assert found[0] == found[1]


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_a_store_given_the_hints_answers_as_one_given_none(ops: list[Any]) -> None:
    asyncio.run(_apply([MemoryStore(), MemoryStore()], ops))


def test_a_continued_record_shares_the_bytes_of_the_one_it_extends() -> None:
    async def run() -> None:
        store = MemoryStore()
        first = with_item_ids([_item(0, i) for i in range(50)])
        await store.put(StoredResponse(_response("resp_a", 0), first, "o"))
        history = [*first, *_response("resp_a", 0)["output"]]
        more = with_item_ids([_item(1, 1)])
        record = StoredResponse(
            _response("resp_b", 1), [*history, *more], "o", extends=("resp_a", 50)
        )
        await store.put(record)
        a, b = store._entries["resp_a"], store._entries["resp_b"]
        assert b.items[0] is a.items[0] and len(b.items) == 2  # shared, and the new piece
        assert a.chain is b.chain and b.chain is not None and b.chain.head == "resp_b"
        assert b.own_ids == 2  # its new ids only: the 50 earlier ones were not walked
        fetched = await store.get("resp_b")
        assert fetched is not None and fetched.input_items == record.input_items
        assert await store.get_item(first[0]["id"]) == first[0]
        assert await store.delete("resp_a")
        assert await store.get_item(first[0]["id"]) == first[0]  # b still holds it

    asyncio.run(run())


def test_the_pieces_of_a_long_chain_are_joined_now_and_then() -> None:
    async def run() -> None:
        store = MemoryStore()
        items = with_item_ids([_item(0, 1)])
        previous = StoredResponse(_response("resp_0", 0), items, "o")
        await store.put(previous)
        for turn in range(1, 80):
            history = [*previous.input_items, *previous.response["output"]]
            items = [*history, *with_item_ids([_item(turn, 1)])]
            extends = (previous.id, len(previous.input_items))
            previous = StoredResponse(_response(f"resp_{turn}", turn), items, "o", extends=extends)
            await store.put(previous)
            assert len(store._entries[previous.id].items) <= 33
        got = await store.get(previous.id)
        assert got is not None and got.input_items == previous.input_items

    asyncio.run(run())


def test_an_id_taken_by_another_chain_goes_back_when_its_own_goes_on() -> None:
    """A record of one conversation holds an item of another (a resolved item_reference:
    id and all); the other conversation's next record holds it too and is the later put:
    deleting the first conversation's record leaves it findable, as in the plain store."""

    async def run() -> None:
        stores = [MemoryStore(), MemoryStore()]
        a = with_item_ids([_item(0, 1)])
        b = with_item_ids([_item(1, 1)])
        plain: list[StoredResponse] = []
        for rid, items, extends in (
            ("resp_a", a, None),
            ("resp_b", b, None),
            ("resp_a2", [*a, *_response("resp_a", 0)["output"], b[0]], ("resp_a", 1)),
            ("resp_b2", [*b, *_response("resp_b", 1)["output"], *with_item_ids([_item(2, 2)])],
             ("resp_b", 1)),
        ):  # fmt: skip
            turn = len(plain)
            for store, hint in zip(stores, (None, extends), strict=True):
                await store.put(StoredResponse(_response(rid, turn), items, "o", extends=hint))
            plain.append(StoredResponse(_response(rid, turn), items, "o"))
        for store in stores:
            assert await store.delete("resp_a2")
        found = [await s.get_item(b[0]["id"]) for s in stores]
        assert found[0] == found[1] == b[0]

    asyncio.run(run())
