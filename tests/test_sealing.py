"""streamer/core/sealing.py and the pure parts of streamer/core/compaction.py, with plain values."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core.batch import Batch
from streamer.core.compaction import Compactor, restore, summary_message
from streamer.core.deltas import Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage, WholeItem
from streamer.core.errors import RequestError
from streamer.core.sealing import MAX_PLAIN_BYTES, MAX_SEALED_CHARS, PREFIX, Sealer

SEALER = Sealer.from_secret(b"s" * 32)


def test_a_blob_opens_only_as_its_kind_under_its_key() -> None:
    blob = SEALER.seal("compaction", "summary", "the summary")
    assert blob.startswith(PREFIX) and "summary" not in blob[len(PREFIX) :]
    assert SEALER.open("compaction", "summary", blob, "p") == "the summary"
    assert Sealer.from_secret(b"s" * 32).open("compaction", "summary", blob, "p") == "the summary"
    for sealer, kind in ((SEALER, "reasoning"), (Sealer.from_secret(b"t" * 32), "compaction")):
        with pytest.raises(RequestError) as caught:
            sealer.open(kind, "summary", blob, "input[2].encrypted_content")  # type: ignore[arg-type]
        assert (caught.value.status, caught.value.param) == (400, "input[2].encrypted_content")


def test_a_blob_opens_only_for_its_owner_and_says_nothing_of_whose_it_is() -> None:
    blob = SEALER.seal("compaction", "summary", "A's summary", owner="alice")
    assert SEALER.open("compaction", "summary", blob, "p", owner="alice") == "A's summary"
    raw = bytearray(base64.urlsafe_b64decode(blob[len(PREFIX) :] + "=="))
    raw[-1] ^= 1
    altered = PREFIX + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    refusals = []
    for other, owner in ((blob, "bob"), (blob, ""), (altered, "alice")):
        with pytest.raises(RequestError) as caught:
            SEALER.open("compaction", "summary", other, "p", owner=owner)
        refusals.append(caught.value.body())
    assert refusals[0] == refusals[1] == refusals[2]  # another owner's is an altered blob
    anonymous = SEALER.seal("reasoning", "text", "t")  # a gateway without keys: one owner, ""
    assert SEALER.open("reasoning", "text", anonymous, "p") == "t"


async def test_a_replay_opens_sealed_items_as_the_recorded_client() -> None:
    from streamer.tap.replay import Recording, replay
    from streamer.turns.turn import TurnOptions

    item = {
        "type": "compaction",
        "encrypted_content": SEALER.seal("compaction", "summary", "S", owner="c1"),
    }
    text = b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
    lines = [
        {
            "kind": "client_request",
            "owner": "c1",
            "body": {"model": "m", "input": [item, {"role": "user", "content": "go"}]},
        },
        {"kind": "backend_request", "body": {"model": "m", "messages": []}},
        {"kind": "backend_chunk", "data": text.decode() + "data: [DONE]\n\n"},
    ]
    events = await replay(Recording(lines), TurnOptions(sealer=SEALER))
    assert events[-1].type == "response.completed"
    lines[0].pop("owner")  # as another client: the item does not open
    with pytest.raises(RequestError, match="could not be opened"):
        await replay(Recording(lines), TurnOptions(sealer=SEALER))


def test_every_blob_has_its_own_nonce() -> None:
    assert SEALER.seal("reasoning", "text", "same") != SEALER.seal("reasoning", "text", "same")


@pytest.mark.parametrize("blob", [None, 7, "", PREFIX, PREFIX + "***", PREFIX + "AAAA"])
def test_what_is_not_a_blob_is_a_400(blob: object) -> None:
    with pytest.raises(RequestError) as caught:
        SEALER.open("compaction", "summary", blob, "input[0].encrypted_content")
    assert caught.value.status == 400 and caught.value.param == "input[0].encrypted_content"


def test_what_is_sealed_is_bounded_and_so_is_what_is_opened() -> None:
    text = "é\x01" * MAX_PLAIN_BYTES  # escapes and multi-byte characters: more JSON than text
    blob = SEALER.seal("reasoning", "text", text)
    assert len(blob) <= MAX_SEALED_CHARS
    opened = SEALER.open("reasoning", "text", blob, "p")
    assert opened.startswith("[…earlier text cut]") and text.endswith(opened[-1000:])
    with pytest.raises(RequestError, match="longer than"):
        SEALER.open("reasoning", "text", PREFIX + "A" * MAX_SEALED_CHARS, "p")


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        Sealer.from_secret(b" short secret \n")


def test_restore_opens_items_in_place_and_names_history_by_previous_response_id() -> None:
    compaction = {
        "type": "compaction",
        "encrypted_content": SEALER.seal("compaction", "summary", "S"),
    }
    reasoning = {
        "type": "reasoning",
        "summary": [],
        "encrypted_content": SEALER.seal("reasoning", "text", "R"),
    }
    items = [{"type": "message", "role": "user", "content": "u"}, compaction, reasoning]
    assert restore([{**compaction, "type": "compaction_summary"}], SEALER) == [summary_message("S")]
    view = restore(items, SEALER)
    assert view[1] == summary_message("S")
    assert view[2]["content"] == [{"type": "reasoning_text", "text": "R"}]
    assert items[2].get("content") is None  # what is stored is what the client sent
    spoilt = [*items[:2], {**reasoning, "encrypted_content": "x"}]
    with pytest.raises(RequestError) as caught:
        restore(spoilt, SEALER, offset=3)
    assert caught.value.param == "previous_response_id"


def test_the_compactor_keeps_only_the_summary_and_makes_one_item() -> None:
    compactor = Compactor(SEALER, "the last request", max_chars=100)
    batch = Batch(
        [ReasoningDelta("hm"), TextDelta("Sum"), ToolCallDelta(0, "c", "f", "{}"), TextDelta("mary"),
         Finish("stop"), Usage(3, 4)],
        end=True,
    )  # fmt: skip
    assert list(compactor(batch)) == [Finish("stop"), Usage(3, 4)]
    (made,) = compactor.item()
    assert isinstance(made, WholeItem) and made.item["type"] == "compaction"
    summary = SEALER.open("compaction", "summary", made.item["encrypted_content"], "p")
    assert summary == "Summary\n\nThe user's last request, verbatim:\nthe last request"
    assert compactor.item() == []
    assert not compactor.exceeded
    compactor(Batch([TextDelta("x" * 200)]))
    assert compactor.exceeded


def test_a_random_key_is_said_in_the_log_when_it_first_seals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="streamer.sealing"):
        Sealer.from_secret(b"k" * 32).seal("compaction", "summary", "x")
        assert caplog.records == []
        ephemeral = Sealer.random()
        ephemeral.seal("compaction", "summary", "x")
        ephemeral.seal("compaction", "summary", "y")
    (record,) = caplog.records
    assert "no --state-key-file" in record.getMessage() and "restart" in record.getMessage()


BLOB = SEALER.seal("compaction", "summary", "a summary worth keeping")


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.text(max_size=200).map(lambda t: PREFIX + t),
        st.integers(0, len(BLOB) - 1).map(lambda n: BLOB[:n]),
        st.tuples(st.integers(len(PREFIX), len(BLOB) - 1), st.characters()).map(
            lambda p: BLOB[: p[0]] + p[1] + BLOB[p[0] + 1 :]
        ),
    )
)
def test_no_mangled_blob_opens_or_fails_otherwise_than_a_400(blob: str) -> None:
    if blob == BLOB:
        return
    try:
        SEALER.open("compaction", "summary", blob, "input[0].encrypted_content")
    except RequestError as exc:
        assert exc.status == 400 and exc.param == "input[0].encrypted_content"
    else:  # only an equivalent base64 spelling of the same blob may open
        assert base64.urlsafe_b64decode(blob[len(PREFIX) :] + "==") == base64.urlsafe_b64decode(
            BLOB[len(PREFIX) :] + "=="
        )
