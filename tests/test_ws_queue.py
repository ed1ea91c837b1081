"""QueueBudget: the per-socket bound on frames and bytes held across lanes (plain values)."""

from __future__ import annotations

from streamer.frontends.ws_queue import Admission, QueueBudget

ACCEPT, REJECT, CLOSE = Admission.ACCEPT, Admission.REJECT, Admission.CLOSE


def test_frames_bound_counts_every_held_frame() -> None:
    budget = QueueBudget(max_bytes=1000, max_frames=3, max_rejected=5)
    assert [budget.offer(10) for _ in range(4)] == [ACCEPT, ACCEPT, ACCEPT, REJECT]
    assert (budget.frames, budget.bytes) == (3, 30)  # the rejected frame holds nothing


def test_bytes_bound_is_checked_before_taking() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=10, max_rejected=5)
    assert budget.offer(60) is ACCEPT
    assert budget.offer(41) is REJECT  # 101 > 100
    assert budget.offer(40) is ACCEPT  # exactly at the bound is allowed
    assert (budget.frames, budget.bytes) == (2, 100)


def test_release_makes_room_again() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=1, max_rejected=5)
    assert budget.offer(80) is ACCEPT
    assert budget.offer(80) is REJECT
    budget.release(80)
    assert (budget.frames, budget.bytes) == (0, 0)
    assert budget.offer(80) is ACCEPT


def test_close_after_max_rejected_in_a_row() -> None:
    budget = QueueBudget(max_bytes=10, max_frames=1, max_rejected=2)
    assert budget.offer(5) is ACCEPT
    assert [budget.offer(5) for _ in range(3)] == [REJECT, REJECT, CLOSE]


def test_an_accepted_frame_resets_the_count() -> None:
    budget = QueueBudget(max_bytes=10, max_frames=1, max_rejected=2)
    budget.offer(5)
    assert [budget.offer(5), budget.offer(5)] == [REJECT, REJECT]
    budget.release(5)
    assert budget.offer(5) is ACCEPT  # the client paced itself: it starts over
    assert [budget.offer(5), budget.offer(5), budget.offer(5)] == [REJECT, REJECT, CLOSE]


def test_zero_rejections_allowed_closes_on_the_first() -> None:
    budget = QueueBudget(max_bytes=10, max_frames=1, max_rejected=0)
    budget.offer(5)
    assert budget.offer(5) is CLOSE


def test_a_frame_larger_than_the_bound_is_never_taken() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=10, max_rejected=5)
    assert budget.offer(101) is REJECT
    assert "larger than this connection may queue (100 bytes)" in budget.describe(101)
    assert (budget.frames, budget.bytes) == (0, 0)


def test_describe_says_what_is_held_and_the_bounds() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=2, max_rejected=5)
    budget.offer(30)
    budget.offer(30)
    message = budget.describe(30)
    assert "2 frames, 60 bytes" in message
    assert "at most 2 frames and 100 bytes" in message


def test_release_never_goes_negative_and_clear_resets() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=2, max_rejected=1)
    budget.release(50)
    assert (budget.frames, budget.bytes) == (0, 0)
    budget.offer(60)
    budget.offer(60)
    budget.clear()
    assert (budget.frames, budget.bytes, budget.rejected) == (0, 0, 0)
