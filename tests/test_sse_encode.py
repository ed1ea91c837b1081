"""`sse.encode_many` (consecutive events of a type joined in one pass) against encoding
each event on its own (differential)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamer.core.events import Event
from streamer.core.sse import encode, encode_each, encode_many

events = st.lists(
    st.builds(
        Event,
        st.sampled_from(["response.output_text.delta", "response.created", "a.b"]),
        st.binary(max_size=8).filter(lambda b: b"\n" not in b),
        st.integers(0, 9),
    ),
    max_size=30,
)


@given(events)
def test_encode_many_is_each_event_encoded_in_turn(batch: list[Event]) -> None:
    expected = b"".join(encode(e) for e in batch)
    assert encode_many(batch) == expected == encode_each(batch)
    assert encode_many(iter(batch)) == expected  # any iterable, a generator too
