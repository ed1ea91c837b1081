"""A turn that resumes a kept turn's lowering against the plain lowering (differential).

`prepare` with a `HistoryCache` lowers only what is new in a conversation: a continuation
(`previous_response_id` with the history its response was lowered from: the WebSocket mode)
or a replay (the last turn's `input`, then more). On random conversations, random new items
(valid or not), earlier items changed, tools, clients and instructions changed between
turns, sealed reasoning in the history, every turn must come out as the plain `prepare`
makes it: the same effective items and view, the same tool map, the same Chat request, and
the same bytes to the backend (`body_pieces` against `orjson.dumps`), or the same 400.
Then: what the cache holds stays within its bound, and a real gateway sends its backend
the same bytes with the cache as without it.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession
from harness import GatewayHarness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from item_strategies import TOOLS, items
from scripted_backend import DONE, finish, text_chunks, tool_call_chunks, usage
from scripted_responses_backend import ScriptedResponsesBackend

from streamer.config import Settings
from streamer.core.compaction import REASONING_FIELD
from streamer.core.errors import RequestError
from streamer.core.sealing import Sealer
from streamer.core.wire_messages import Encoded, LoweredMessages, body_pieces, encode_body
from streamer.turns.history_reuse import MIN_ITEMS, HistoryCache, inputs
from streamer.turns.options import turn_options
from streamer.turns.turn import Turn, TurnOptions, prepare
from streamer.upstream.chat.kind import CHAT
from streamer.upstream.chat.profiles import BackendProfile
from streamer.upstream.responses.kind import RESPONSES

SEALER = Sealer.random()
BIG = 64 * 1024 * 1024


def options(history: bool, **kw: Any) -> TurnOptions:
    return TurnOptions(sealer=SEALER, history=HistoryCache(BIG) if history else None, **kw)


def outcome(opts: TurnOptions, request: dict[str, Any], history: Any, client: str) -> Any:
    try:
        return prepare(copy.copy(request), opts, history=history, client=client)
    except RequestError as exc:
        return ("400", exc.message, exc.param)


def same(cached: Any, plain: Any, kind: Any = CHAT) -> None:
    """The turn with the cache is the plain turn, down to the bytes the backend gets (as
    its kind sends the request: a Chat body's `messages`, a Responses body's `input`)."""
    if not isinstance(plain, Turn):
        assert cached == plain
        return
    assert isinstance(cached, Turn)
    assert cached.items == plain.items
    assert cached.view == plain.view
    assert cached.names == plain.names
    assert cached.backend_request == plain.backend_request
    wire = kind.body(BackendProfile("test"))
    sent = wire(cached.backend_request)
    assert encode_body(sent) == orjson.dumps(wire(plain.backend_request))
    strip = ("id", "created_at")
    assert {k: v for k, v in cached.response.items() if k not in strip} == {
        k: v for k, v in plain.response.items() if k not in strip
    }


def sealed_reasoning(text: str) -> dict[str, Any]:
    blob = SEALER.seal("reasoning", REASONING_FIELD, text, owner="c1")
    return {"type": "reasoning", "summary": [], "encrypted_content": blob}


OUTPUTS = st.lists(
    st.sampled_from(
        [
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
            {"type": "function_call", "call_id": "c9", "name": "run", "namespace": "mcp__a",
             "arguments": '{"q":2}', "id": "fc_1", "status": "completed"},
            sealed_reasoning("why"),
        ]
    ),
    max_size=3,
)  # fmt: skip
CHANGES = st.sampled_from(["none"] * 6 + ["client", "tools", "instructions", "earlier"])
NEW = st.one_of(items(odd=False, max_size=4), items(max_size=3))  # odd ones: 400s, mostly
TURNS = st.lists(
    st.tuples(st.sampled_from(["replay", "continue"]), NEW, OUTPUTS, CHANGES),
    min_size=1,
    max_size=5,
)
HISTORIES = st.one_of(
    items(odd=False, max_size=8), items(odd=False, min_size=MIN_ITEMS, max_size=40)
)
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]


def changed(request: dict[str, Any], change: str) -> tuple[dict[str, Any], str]:
    client = "c2" if change == "client" else "c1"
    if change == "tools":
        request = {**request, "tools": TOOLS[:-1]}
    elif change == "instructions":
        request = {**request, "instructions": "Be long."}
    elif change == "earlier" and request.get("input"):
        first = {"type": "message", "role": "user", "content": "changed"}
        request = {**request, "input": [first, *request["input"][1:]]}
    return request, client


@settings(max_examples=250, deadline=None, suppress_health_check=SLOW)
@given(
    HISTORIES,
    TURNS,
    st.sampled_from([[], [sealed_reasoning("before")]]),
    st.sampled_from([CHAT, RESPONSES]),
)
def test_every_turn_of_a_conversation_is_the_plain_turn(
    start: list[Any], turns: list[Any], sealed: list[Any], kind: Any
) -> None:
    cached_opts, plain_opts = options(True, kind=kind), options(False, kind=kind)
    request = {"model": "m", "tools": TOOLS, "instructions": "Be brief.", "input": sealed + start}
    cached = outcome(cached_opts, request, (), "c1")
    same(cached, outcome(plain_opts, request, (), "c1"), kind)
    for mode, new, output, change in turns:
        if not isinstance(cached, Turn):
            return
        if mode == "replay":
            turn_request = {**request, "input": [*request["input"], *output, *new]}
            history: tuple[Any, ...] = ()
        else:
            turn_request = {**request, "input": new, "previous_response_id": cached.response["id"]}
            history = (*cached.items, *output)
        turn_request, client = changed(turn_request, change)
        plain = outcome(plain_opts, turn_request, history, client)
        cached = outcome(cached_opts, turn_request, history, client)
        same(cached, plain, kind)
        request = {**turn_request, "input": [*history, *new]} if mode != "replay" else turn_request
        request.pop("previous_response_id", None)


def conversation(k: int, size: int = 50) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "go"}]
    for i in range(k // 2):
        out.append({"type": "function_call", "call_id": f"c{i}", "name": "run",
                    "namespace": "mcp__a", "arguments": '{"q":1}'})  # fmt: skip
        out.append({"type": "function_call_output", "call_id": f"c{i}", "output": "x" * size})
    return out


REQUEST = {"model": "m", "tools": TOOLS, "instructions": "Be brief."}
NEXT = [{"type": "function_call_output", "call_id": "c9", "output": "more"}]
CALL = {"type": "function_call", "call_id": "c9", "name": "run", "arguments": "{}"}


@pytest.mark.parametrize(("kind", "key"), [(CHAT, "messages"), (RESPONSES, "input")])
def test_a_continuation_resumes_the_turn_it_continues(kind: Any, key: str) -> None:
    opts = options(True, kind=kind)
    first = prepare({**REQUEST, "input": conversation(40, 400)}, opts, client="c1")
    history = (*first.items, CALL)
    body = {**REQUEST, "input": NEXT, "previous_response_id": first.response["id"]}
    got = inputs(body, opts, history, "c1")
    assert got.resumed is not None and len(got.resumed.items) == len(first.items)
    turn = prepare(body, opts, history=history, client="c1")
    lowered = turn.backend_request[key]
    assert isinstance(lowered, LoweredMessages) and lowered.encoded.count > 40
    assert len(body_pieces(kind.body(BackendProfile("test"))(turn.backend_request))) > 1
    same(turn, prepare(body, options(False, kind=kind), history=history), kind)


@pytest.mark.parametrize("kind", [CHAT, RESPONSES])
def test_two_continuations_of_one_turn_each_get_their_own_lowering(kind: Any) -> None:
    """A fork: the first goes on in the kept turn's message list, the second from a copy;
    and a third continues the first."""
    opts, plain = options(True, kind=kind), options(False, kind=kind)
    first = prepare({**REQUEST, "input": conversation(40)}, opts, client="c1")
    turns = []
    for extra in ("one", "two"):
        history = (*first.items, CALL)
        new = [{"type": "function_call_output", "call_id": "c9", "output": extra}]
        body = {**REQUEST, "input": new, "previous_response_id": first.response["id"]}
        turn = prepare(body, opts, history=history, client="c1")
        same(turn, prepare(body, plain, history=history), kind)
        turns.append(turn)
    history = (*turns[0].items, CALL)
    body = {**REQUEST, "input": NEXT, "previous_response_id": turns[0].response["id"]}
    again = prepare(body, opts, history=history, client="c1")
    same(again, prepare(body, plain, history=history), kind)
    assert opts.history is not None and opts.history.hits == 3


def test_a_replay_resumes_the_last_turn_of_its_conversation() -> None:
    opts = options(True)
    first = {**REQUEST, "input": conversation(40)}
    prepare(first, opts, client="c1")
    again = {**REQUEST, "input": [*first["input"], CALL, *NEXT]}
    assert inputs(again, opts, (), "c1").resumed is not None
    same(prepare(again, opts, client="c1"), prepare(again, options(False)))
    assert opts.history is not None and opts.history.hits == 2


@pytest.mark.parametrize(
    "change",
    [
        {"client": "c2"},
        {"request": {"tools": TOOLS[:1]}},
        {"request": {"instructions": "Other."}},
        {"first": {"type": "message", "role": "user", "content": "not go"}},
    ],
)
def test_a_turn_in_another_context_is_lowered_in_full(change: dict[str, Any]) -> None:
    opts = options(True)
    first = {**REQUEST, "input": conversation(40)}
    prepare(first, opts, client="c1")
    items_ = [*first["input"], *NEXT]
    if "first" in change:
        items_[0] = change["first"]
    again = {**REQUEST, **change.get("request", {}), "input": items_}
    assert inputs(again, opts, (), change.get("client", "c1")).resumed is None
    same(prepare(again, opts, client=change.get("client", "c1")), prepare(again, options(False)))


def test_another_models_options_never_resume_a_turn() -> None:
    cache = HistoryCache(BIG)
    one, other = TurnOptions(history=cache), TurnOptions(history=cache)
    first = {**REQUEST, "input": conversation(40)}
    prepare(first, one, client="c1")
    assert inputs({**first, "input": [*first["input"], *NEXT]}, other, (), "c1").resumed is None


@pytest.mark.parametrize(
    "new",
    [
        [
            {
                "type": "compaction",
                "encrypted_content": SEALER.seal("compaction", "summary", "s", owner="c1"),
            }
        ],
        [{"type": "additional_tools", "tools": [{"type": "function", "name": "late"}]}],
    ],
)
def test_a_new_item_that_reaches_back_makes_a_plain_turn(new: list[Any]) -> None:
    opts = options(True)
    first = prepare({**REQUEST, "input": conversation(40)}, opts, client="c1")
    history = (*first.items, CALL)
    body = {**REQUEST, "input": [*NEXT, *new], "previous_response_id": first.response["id"]}
    assert inputs(body, opts, history, "c1").resumed is None
    same(outcome(opts, body, history, "c1"), outcome(options(False), body, history, "c1"))


def test_a_bad_new_item_is_the_same_400_with_its_index() -> None:
    opts = options(True)
    first = {**REQUEST, "input": conversation(40)}
    prepare(first, opts, client="c1")
    bad = {"type": "function_call_output", "call_id": "", "output": "x"}
    again = {**REQUEST, "input": [*first["input"], CALL, bad]}
    got = outcome(opts, again, (), "c1")
    assert got == outcome(options(False), again, (), "c1")
    assert got[2] == f"input[{len(first['input']) + 1}].call_id"
    sealed = {**sealed_reasoning("x"), "encrypted_content": "not a blob"}
    again = {**REQUEST, "input": [*first["input"], sealed]}
    got = outcome(opts, again, (), "c1")
    assert got == outcome(options(False), again, (), "c1")
    assert got[2] == f"input[{len(first['input'])}].encrypted_content"


def test_short_inputs_are_neither_kept_nor_looked_up() -> None:
    opts = options(True)
    turn = prepare({**REQUEST, "input": conversation(MIN_ITEMS - 2)}, opts, client="c1")
    assert opts.history is not None and len(opts.history) == 0
    assert not isinstance(turn.backend_request["messages"], LoweredMessages)


def test_the_cache_holds_at_most_its_bytes() -> None:
    """Try to exceed the bound: turns of ever new conversations, each kept."""
    cache = HistoryCache(2 * 1024 * 1024)
    opts = TurnOptions(sealer=SEALER, history=cache)
    sizes = []
    for i in range(60):
        request = {**REQUEST, "input": conversation(200), "instructions": f"Run {i}."}
        prepare(request, opts, client="c1")
        sizes.append(cache.bytes)
        assert cache.bytes <= cache.max_bytes
    assert 0 < len(cache) < 60 and max(sizes) > cache.max_bytes // 2
    huge = HistoryCache(1000)
    prepare({**REQUEST, "input": conversation(200)}, TurnOptions(history=huge), client="c1")
    assert len(huge) == 0 and huge.bytes == 0  # larger than the bound: not kept at all


def test_the_setting_sizes_the_cache_and_zero_turns_it_off() -> None:
    kept = turn_options(Settings(history_cache_bytes=5 * 1024 * 1024)).history
    assert kept is not None and kept.max_bytes == 5 * 1024 * 1024
    assert turn_options(Settings(history_cache_bytes=0)).history is None
    with pytest.raises(ValueError, match="history-cache-bytes"):
        turn_options(Settings(history_cache_bytes=-1))


# -- the bytes ------------------------------------------------------------------------------

MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "tool", "assistant"]),
     "content": st.one_of(st.none(), st.text(max_size=6000))}
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW)
@given(
    st.lists(MESSAGE, max_size=12),
    st.lists(st.integers(0, 12), max_size=5),
    st.integers(0, 1),
    st.lists(MESSAGE, max_size=3),
    st.integers(0, 3),
    st.booleans(),
)
def test_the_pieces_are_the_bytes_of_the_body(
    messages: list[Any], cuts: list[int], lead: int, appended: list[Any], at: int, cut: bool
) -> None:
    lead = min(lead, len(messages))
    encoded = Encoded()
    for n in sorted(cuts):  # blobs as turns would add them
        encoded = encoded.extend(messages[lead:][: max(n, encoded.count)])
    lowered = LoweredMessages(messages, lead, encoded)
    lowered.extend(appended)  # added after lowering (a compaction's handover prompt)
    if cut and lowered:
        lowered.pop()  # shorter than lowered: encoded in full
    fields = [("model", "m"), ("stream", True), ("tools", [{"type": "function"}])]
    fields.insert(min(at, len(fields)), ("messages", lowered))
    body = dict(fields)
    assert b"".join(body_pieces(body)) == orjson.dumps(body) == encode_body(body)


# -- through a gateway ----------------------------------------------------------------------


def _answer() -> list[Any]:
    chunks = tool_call_chunks(0, "c9", ["mcp__a__run"], ['{"q":', "2}"])
    return [*text_chunks(["ok"]), *chunks, finish("tool_calls"), usage(5, 2), DONE]


async def _ws_session(gw: GatewayHarness) -> list[bytes]:
    """Three WebSocket turns: a 40-item history, then two continuations."""
    gw.backend.responder = lambda body: _answer()
    async with ClientSession() as session, session.ws_connect(gw.ws_url) as ws:
        previous, new = None, conversation(40)
        for _ in range(3):
            frame = {"type": "response.create", **REQUEST, "input": new, "store": False}
            if previous:
                frame["previous_response_id"] = previous
            await ws.send_str(orjson.dumps(frame).decode())
            while True:
                event = orjson.loads((await ws.receive()).data)
                if event["type"] == "response.completed":
                    previous = event["response"]["id"]
                    break
                assert event["type"] != "error", event
            new = NEXT
    return _sent(gw)


def _sent(gw: GatewayHarness) -> list[bytes]:
    """The bodies of the model requests the backend got (Chat or Responses)."""
    paths = ("/chat/completions", "/responses")
    return [r.raw for r in gw.backend.records if r.path.endswith(paths)]


def _gateway(api: str, size: int) -> GatewayHarness:
    if api == "chat":
        return GatewayHarness(history_cache_bytes=size)
    backend = ScriptedResponsesBackend(personality="openai")
    return GatewayHarness(
        backend=backend, upstream_api="responses", backend_profile="openai",
        history_cache_bytes=size,
    )  # fmt: skip


async def _replays(gw: GatewayHarness) -> list[bytes]:
    """Three HTTP turns, each with the whole history (long enough a body to be kept)."""
    gw.backend.responder = lambda body: _answer()
    history = conversation(40, 4000)
    async with ClientSession() as session:
        for _ in range(3):
            body = {**REQUEST, "input": history, "store": False}
            async with session.post(gw.url + "/responses", json=body) as resp:
                answer = await resp.json()
            history = [*history, *answer["output"], *NEXT]
    return _sent(gw)


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("drive", [_ws_session, _replays])
async def test_the_backend_gets_the_same_bytes_with_the_cache_as_without(
    drive: Any, api: str
) -> None:
    sent = {}
    for size in (0, BIG):
        async with _gateway(api, size) as gw:
            sent[size] = await drive(gw)
            cache, bodies = gw.gateway.options.history, gw.gateway.bodies
            hits = cache.hits if cache is not None else 0
            parsed = bodies.hits if bodies is not None else 0
        assert len(sent[size]) == 3
        assert hits == (2 if size else 0)  # the cache was used: both later turns resumed
        if drive is _replays:  # and the bodies were parsed past what the last one held
            assert parsed == (2 if size else 0)
    assert sent[0] == sent[BIG]


async def _stored_chain(gw: GatewayHarness) -> list[bytes]:
    """Three HTTP turns chained by previous_response_id, stored: the history from the kept
    turn, the store asked only for the response; what the store lists stays the plain one."""
    gw.backend.responder = lambda body: _answer()
    previous, new, listed = None, conversation(40), []
    async with ClientSession() as session:
        for _ in range(3):
            body: dict[str, Any] = {**REQUEST, "input": new}
            if previous:
                body["previous_response_id"] = previous
            async with session.post(gw.url + "/responses", json=body) as resp:
                assert resp.status == 200, await resp.text()
                previous = (await resp.json())["id"]
            url = f"{gw.url}/responses/{previous}/input_items?limit=100&order=asc"
            async with session.get(url) as resp:
                listed.append((await resp.json())["data"])
            new = NEXT
    first_ids = [item["id"] for item in listed[0]]
    assert [item["id"] for item in listed[2]][: len(first_ids)] == first_ids  # ids kept
    strip = [[{k: v for k, v in i.items() if k != "id"} for i in page] for page in listed]
    return [*_sent(gw), orjson.dumps(strip)]


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_stored_chain_sends_and_stores_what_the_plain_one_does(api: str) -> None:
    sent = {}
    for size in (0, BIG):
        async with _gateway(api, size) as gw:
            sent[size] = await _stored_chain(gw)
            cache = gw.gateway.options.history
            # a Responses backend is sent the history as the store lists it: in full
            resumed = 2 if size and api == "chat" else 0
            assert (cache.hits if cache is not None else 0) == resumed
            entries = gw.gateway.store._entries  # type: ignore[attr-defined]
            shared = [e.items[0] for e in entries.values()]
        assert len(sent[size]) == 4
        if size:  # the three records hold the first turn's items once
            assert shared[0] is shared[1] is shared[2]
    assert sent[0] == sent[BIG]
