"""Tests of the fresh-process probes (bench/fresh_probes.py): a real load backend and a real
`streamer serve` on loopback, the real load client; no timing assertions."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fresh_probes
import report
import targets


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[fresh_probes.Setup]:
    backend = targets.start_backend(5, 2, None, tmp_path)
    try:
        yield fresh_probes.Setup(backend, None, None, tmp_path, [], 0.3, 0.2, 1, True)
    finally:
        targets.stop(backend.proc)


def test_the_verdicts_are_the_issues_targets() -> None:
    assert fresh_probes.verdict("peak_rss_mb", 63.9) == "ok"
    assert fresh_probes.verdict("peak_rss_mb", 64.0) == "missed"  # "under 64 MB"
    assert fresh_probes.verdict("cpu_us_per_request", 200.0) == "ok"  # "at most"
    assert fresh_probes.verdict("cpu_us_per_request", 201.0) == "missed"
    assert fresh_probes.verdict("cpu_us_per_event", 2.0) == "ok"
    assert fresh_probes.verdict("cpu_us_per_event", None) == "n/a"


def test_each_probe_measures_a_new_gateway_process(setup: fresh_probes.Setup) -> None:
    result = fresh_probes.run(setup, [5], [], (5, 2))
    (tree,) = result["trees"]
    assert [(c["n"], c["transport"]) for c in tree["rss"]] == [(5, "sse"), (5, "ws")]
    for cell in tree["rss"]:
        assert "error" not in cell, cell
        assert cell["peak_rss_mb"] >= cell["idle_rss_mb"] > 0
        assert cell["failures"] == 0
    for cell in tree["cpu_request"] + tree["cpu_event"]:
        assert "error" not in cell, cell
        assert cell["cpu_us_per_request"] > cell["cpu_us_per_event"] > 0
        assert cell["c"] == fresh_probes.CPU_C
    assert [c["n"] for c in tree["cpu_request"]] == [fresh_probes.REQUEST_N] * 2
    assert [c["n"] for c in tree["cpu_event"]] == [fresh_probes.EVENT_N] * 2
    assert set(tree["verdicts"]) == set(fresh_probes.TARGETS)
    assert list(setup.logs.glob("fresh-streamer.log"))  # the gateways' log is kept
    ab = tree["fast_http"]  # --fast-http true and false, alternated, a process each
    assert ab["rounds"] == 2 and len(ab["on"]) == len(ab["off"]) == len(ab["saved"]) == 2
    assert min(ab["on"] + ab["off"]) > 0 and "errors" not in ab
    assert [a - b for a, b in zip(ab["off"], ab["on"], strict=True)] == ab["saved"]
    assert list(setup.logs.glob("fresh-streamer-fast-http-false.log"))


def test_the_summary_shows_every_probe_with_its_target() -> None:
    cell = {"n": 200, "m": 50, "c": 64, "idle_rss_mb": 40.0, "failures": 0}
    rss = [cell | {"transport": "sse", "peak_rss_mb": 50.0}, cell | {"transport": "ws"}]
    rss[1]["error"] = "gateway did not start"
    cpu = {"c": 16, "failures": 0, "transport": "sse"}
    tree = {
        "name": "streamer",
        "rss": rss,
        "cpu_request": [cpu | {"n": 1, "m": 1, "cpu_us_per_request": 250.0}],
        "cpu_event": [cpu | {"n": 2000, "m": 50, "cpu_us_per_event": 1.5}],
        "verdicts": {
            "peak_rss_mb": "n/a",
            "cpu_us_per_request": "missed",
            "cpu_us_per_event": "ok",
        },
    }
    lines = fresh_probes.markdown({"trees": [tree]})
    text = "\n".join(lines)
    assert (
        "| streamer | peak RSS, c=64, N=200 (idle 40.0 MB) | 50.0 MB | - MB | < 64 MB | ok |"
        in text
    )
    assert "| CPU µs per request, N=1, M=1, c=16 | 250 | - | ≤ 200 | missed |" in text
    assert "| CPU µs per event, N=2000, M=50, c=16 | 1.50 | - | ≤ 2 | ok |" in text
    assert "- streamer ws N=200: gateway did not start" in text
    assert "| gateway | rounds | on | off | saved | verdict |" not in text  # it did not run
    tree["fast_http"] = {
        "on": [250.0, 260.0, 255.0], "off": [300.0, 330.0, 290.0], "saved": [50.0, 70.0, 35.0],
        "median_on": 255.0, "median_off": 300.0, "median_saved": 50.0, "pays": True,
    }  # fmt: skip
    text = "\n".join(fresh_probes.markdown({"trees": [tree]}))
    assert "| streamer | 3 | 255 (250-260) | 300 (290-330) | 50 (35 to 70) | ≥ 40: pays |" in text
    assert fresh_probes.markdown({}) == fresh_probes.markdown(None) == []
    result = {
        "meta": {"started": "now", "command": "x", "machine": "m", "pinning": "p",
                 "settings": {"runs": 1, "duration": 1, "warmup": 0, "m": 50, "n": [200],
                              "concurrency": [16]}},
        "cells": [], "targets": [], "fresh": {"trees": [tree]},
    }  # fmt: skip
    assert "## Fresh-process probes" in report.markdown(result)
