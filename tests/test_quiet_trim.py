"""QuietTrim: freed memory goes back to the OS only after a quiet spell, never mid-turn.

Time is a `ManualClock`: the checks fire when the test advances it, never because the
machine was slow (the old sleep-timed version failed 4 runs in 10 under CPU load).
"""

from __future__ import annotations

import asyncio

from builders import ManualClock

from streamer.turns.quiet_trim import QuietTrim, malloc_trim

DELAY = 0.05


def counting() -> tuple[QuietTrim, list[int], ManualClock]:
    clock = ManualClock()
    calls: list[int] = []
    quiet = QuietTrim(DELAY, lambda: calls.append(quiet.running), call_later=clock.call_later)
    return quiet, calls, clock


def test_trims_once_after_the_last_turn_has_been_over_for_the_delay() -> None:
    quiet, calls, clock = counting()
    quiet.started()
    quiet.started()
    quiet.ended()
    clock.advance(DELAY * 3)
    assert calls == []  # one turn still runs
    quiet.ended()
    clock.advance(DELAY / 2)
    assert calls == []  # not quiet for long enough yet
    clock.advance(DELAY / 2)
    assert calls == [0] and quiet.trims == 1
    clock.advance(DELAY * 3)
    assert calls == [0]  # nothing ran since: no second trim
    assert clock.pending == 0


def test_a_turn_inside_the_quiet_spell_restarts_the_wait() -> None:
    quiet, calls, clock = counting()
    quiet.started()
    quiet.ended()
    clock.advance(DELAY * 0.6)
    quiet.started()  # a short turn comes and goes before the check
    quiet.ended()
    clock.advance(DELAY * 0.6)
    assert calls == []  # the first check saw a turn in its spell
    clock.advance(DELAY * 0.6)
    assert calls == []  # the wait restarted at that check: a whole delay from it
    clock.advance(DELAY * 0.4)
    assert calls == [0]


def test_busy_at_the_check_waits_for_the_end() -> None:
    quiet, calls, clock = counting()
    quiet.started()
    quiet.ended()
    quiet.started()  # still running when the check comes
    clock.advance(DELAY * 2)
    assert calls == []
    assert clock.pending == 0  # a busy check arms nothing: the turn's end will
    quiet.ended()
    clock.advance(DELAY * 2)
    assert calls == [0]


def test_disabled_and_closed() -> None:
    clock = ManualClock()
    off = QuietTrim(DELAY, None, call_later=clock.call_later)
    off.started()
    off.ended()
    assert clock.pending == 0  # disabled: not even a timer
    clock.advance(DELAY * 2)
    assert off.trims == 0
    quiet, calls, clock = counting()
    quiet.started()
    quiet.ended()
    quiet.close()  # shutdown: the pending check is cancelled
    clock.advance(DELAY * 2)
    assert calls == []


async def test_the_real_malloc_trim_runs_on_the_event_loop() -> None:
    trim = malloc_trim()
    assert trim is not None  # glibc on every machine this runs on
    assert trim() in (0, 1)
    trimmed = asyncio.Event()

    def trim_and_tell() -> None:
        trim()
        trimmed.set()

    quiet = QuietTrim(DELAY, trim_and_tell)  # the default clock: the running loop's timers
    quiet.started()
    quiet.ended()
    await asyncio.wait_for(trimmed.wait(), 30)
    assert quiet.trims == 1
