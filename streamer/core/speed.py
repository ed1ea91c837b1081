"""The hot path's speed tricks, each behind one named switch (pure).

Every trick below has a plain equivalent that gives the same output, and a differential test
that runs both (tests/test_speed.py runs the whole per-event pipeline with every switch on,
off, and each stage alone off). A stage named in `--reference` (`STREAMER_REFERENCE`: stage
names, comma-separated, or `all`) runs its plain equivalent instead: a correctness check on
a live gateway, and the row of `bench/bench_pipeline.py` that prices the tricks (`--plain`).
Each object of a stage reads its switch when it is made (a stream's decoders, a turn's
streamer), never per event.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

STAGES: dict[str, str] = {
    "chunked": "HTTP/1.1 chunked bodies cut in bulk (upstream/http1/wire.py), not chunk by chunk",
    "sse": "a read of whole events cut in one C pass (core/sse.py, responses/framing.py), "
    "not line by line",
    "shapes": "per-token events sliced through learnt shapes (chat/chunk_shapes.py, "
    "responses/event_shapes.py, anthropic/event_shapes.py), not parsed whole",
    "runs": "runs of per-token Chat chunks decoded together (chat/runs.py), not one by one",
    "output": "the streamer's per-token paths (core/output.py), not every delta through its handler",
    "encode": "a read's events encoded in one join per event type (core/sse.py encode_many), "
    "not one by one",
}

_fast: dict[str, bool] = dict.fromkeys(STAGES, True)


def fast(stage: str) -> bool:
    """Whether `stage` runs its speed trick (False: its plain equivalent)."""
    return _fast[stage]


def parse_reference(text: str) -> tuple[str, ...]:
    """`--reference`'s value as stage names (`all`: every stage); `ValueError` naming an
    unknown one."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if "all" in names:
        return tuple(STAGES)
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        known = ", ".join([*STAGES, "all"])
        raise ValueError(f"--reference: unknown stage {unknown[0]!r} (one of {known})")
    return names


def use_reference(text: str) -> tuple[str, ...]:
    """Run the plain equivalent of the stages `text` names, the tricks of the others; the
    stages now on their reference."""
    names = parse_reference(text)
    for stage in STAGES:
        _fast[stage] = stage not in names
    return names


def reference() -> tuple[str, ...]:
    """The stages on their plain equivalent now."""
    return tuple(stage for stage, on in _fast.items() if not on)


@contextmanager
def using(text: str) -> Iterator[tuple[str, ...]]:
    """`use_reference(text)` for a block, the switches as they were after it (tests, bench)."""
    before = reference()
    try:
        yield use_reference(text)
    finally:
        use_reference(",".join(before))
