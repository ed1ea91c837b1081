"""The open-file budget (streamer/fd_budget.py) and the background turn caps
(streamer/frontends/background_caps.py), with plain values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamer.config import Settings
from streamer.fd_budget import FdBudget, for_settings, split
from streamer.frontends.background_caps import ALL, TurnCaps


def test_the_default_split_of_1024_descriptors() -> None:
    """The README's table: an eighth in reserve, half the rest to clients, the other half
    to backend connections; background turns get half of those, one client a quarter."""
    budget = split(1024)
    assert (budget.reserve, budget.clients, budget.backend) == (128, 448, 448)
    assert (budget.background, budget.background_per_client) == (224, 56)
    assert budget.fds == 1024 and not budget.over


def test_the_embedded_model_pays_two_descriptors_per_backend_connection() -> None:
    budget = split(1024, backend_fds=2)
    assert (budget.clients, budget.backend, budget.background) == (448, 224, 112)
    assert budget.fds == 1024


def test_recordings_take_a_descriptor_per_turn() -> None:
    """Under --tap-dir each client's turn and each background turn hold a file too."""
    budget = split(1024, turn_files=1)
    assert budget.clients == 224  # two descriptors each
    assert budget.background == budget.backend // 2
    assert budget.fds <= 1024


def test_explicit_caps_are_kept_and_the_defaults_share_what_is_left() -> None:
    budget = split(1024, clients=96)
    assert budget.clients == 96
    assert budget.backend == 1024 - 128 - 96  # all that is left
    budget = split(1024, backend=200, background=10, per_client=10)
    assert (budget.backend, budget.background, budget.background_per_client) == (200, 10, 10)
    assert budget.clients == 1024 - 128 - 200


def test_explicit_caps_over_the_limit_are_said_to_be() -> None:
    budget = split(1024, clients=1000)
    assert budget.clients == 1000 and budget.backend >= 1 and budget.background >= 1
    assert budget.over
    assert "1000 client connections" in budget.describe()


def test_a_tiny_limit_still_leaves_one_of_each() -> None:
    budget = split(8)
    assert min(budget.clients, budget.backend, budget.background) >= 1
    assert budget.reserve == 4  # never more than half


@given(
    st.integers(64, 1 << 20),
    st.sampled_from([1, 2]),
    st.sampled_from([0, 1]),
)
def test_the_defaults_never_ask_for_more_than_the_limit(
    nofile: int, backend_fds: int, turn_files: int
) -> None:
    budget = split(nofile, backend_fds=backend_fds, turn_files=turn_files)
    assert not budget.over, budget
    assert budget.background <= budget.backend // 2 + 1  # turns with a client keep half
    assert budget.background_per_client <= budget.background


def test_settings_map_onto_the_budget() -> None:
    embedded = for_settings(Settings(), 1024)
    assert embedded.backend_fds == 2
    remote = for_settings(Settings(upstream="http://127.0.0.1:1/v1", tap_dir="/tmp/t"), 1024)
    assert (remote.backend_fds, remote.turn_files) == (1, 1)
    given_ = for_settings(Settings(background_max_turns=7, background_max_per_client=3), 1024)
    assert (given_.background, given_.background_per_client) == (7, 3)
    with pytest.raises(ValueError, match="--background-max-turns"):
        for_settings(Settings(background_max_turns=-1), 1024)
    assert isinstance(embedded, FdBudget)


# -- the background turn caps ---------------------------------------------------------


def test_each_client_is_capped_and_so_is_the_whole() -> None:
    caps = TurnCaps(total_cap=3, per_client_cap=2)
    assert caps.take("a") is None and caps.take("a") is None
    refused = caps.take("a")
    assert refused is not None and (refused.client, refused.cap) == ("a", 2)
    assert caps.take("b") is None  # "a"'s cap is its own
    refused = caps.take("c")
    assert refused is not None and (refused.client, refused.cap) == (ALL, 3)
    assert (caps.total, caps.running) == (3, {"a": 2, "b": 1})


def test_a_cap_is_logged_once_until_it_has_room_again() -> None:
    caps = TurnCaps(total_cap=10, per_client_cap=1)
    caps.take("a")
    first, again = caps.take("a"), caps.take("a")
    assert first is not None and first.first
    assert again is not None and not again.first  # a flood is one log line, not thousands
    caps.give("a")
    assert caps.take("a") is None
    refused = caps.take("a")
    assert refused is not None and refused.first  # full again: said again


def test_give_frees_a_slot_and_never_counts_below_zero() -> None:
    caps = TurnCaps(total_cap=1, per_client_cap=1)
    caps.give("nobody")
    assert caps.take("a") is None
    caps.give("a")
    caps.give("a")
    assert (caps.total, caps.running) == (0, {})
    assert caps.take("b") is None


def test_a_refusal_is_a_429_in_openai_rate_limit_shape() -> None:
    caps = TurnCaps(total_cap=1, per_client_cap=1)
    caps.take("a")
    refused = caps.take("a")
    assert refused is not None
    error = refused.error()
    assert error.status == 429
    assert error.headers == {"retry-after": "1"}
    details = error.body()["error"]
    assert (details["type"], details["code"], details["param"]) == (
        "requests",
        "rate_limit_exceeded",
        "background",
    )
    assert "at most 1 at once" in details["message"]
    assert "for client a" in refused.log_line()
    everyone = caps.take("b")
    assert everyone is not None and "in all" in everyone.log_line()
    assert "on this server" in everyone.error().message


def test_caps_below_one_are_refused() -> None:
    with pytest.raises(ValueError):
        TurnCaps(total_cap=0, per_client_cap=1)
