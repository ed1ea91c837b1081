"""QuietTrim: freed memory goes back to the OS only after a quiet spell, never mid-turn."""

from __future__ import annotations

import asyncio

from streamer.quiet_trim import QuietTrim, malloc_trim

DELAY = 0.05


def counting() -> tuple[QuietTrim, list[int]]:
    calls: list[int] = []
    quiet = QuietTrim(DELAY, lambda: calls.append(quiet.running))
    return quiet, calls


async def test_trims_once_after_the_last_turn_has_been_over_for_the_delay() -> None:
    quiet, calls = counting()
    quiet.started()
    quiet.started()
    quiet.ended()
    await asyncio.sleep(DELAY * 3)
    assert calls == []  # one turn still runs
    quiet.ended()
    await asyncio.sleep(DELAY / 2)
    assert calls == []  # not quiet for long enough yet
    await asyncio.sleep(DELAY * 2)
    assert calls == [0] and quiet.trims == 1
    await asyncio.sleep(DELAY * 3)
    assert calls == [0]  # nothing ran since: no second trim


async def test_a_turn_inside_the_quiet_spell_restarts_the_wait() -> None:
    quiet, calls = counting()
    quiet.started()
    quiet.ended()
    await asyncio.sleep(DELAY * 0.6)
    quiet.started()  # a short turn comes and goes before the check
    quiet.ended()
    await asyncio.sleep(DELAY * 0.6)
    assert calls == []  # the first check saw a turn in its spell
    await asyncio.sleep(DELAY * 2)
    assert calls == [0]


async def test_busy_at_the_check_waits_for_the_end() -> None:
    quiet, calls = counting()
    quiet.started()
    quiet.ended()
    quiet.started()  # still running when the check comes
    await asyncio.sleep(DELAY * 2)
    assert calls == []
    quiet.ended()
    await asyncio.sleep(DELAY * 2)
    assert calls == [0]


async def test_disabled_and_closed() -> None:
    off = QuietTrim(DELAY, None)
    off.started()
    off.ended()
    await asyncio.sleep(DELAY * 2)
    assert off.trims == 0
    quiet, calls = counting()
    quiet.started()
    quiet.ended()
    quiet.close()  # shutdown: the pending check is cancelled
    await asyncio.sleep(DELAY * 2)
    assert calls == []


async def test_the_real_malloc_trim_runs() -> None:
    trim = malloc_trim()
    assert trim is not None  # glibc on every machine this runs on
    assert trim() in (0, 1)
    quiet = QuietTrim(DELAY, trim)
    quiet.started()
    quiet.ended()
    await asyncio.sleep(DELAY * 3)
    assert quiet.trims == 1
