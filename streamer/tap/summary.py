"""The summary that ends every tap run: events, items, calls by identity, tokens, timing.

`Summary` is filled while the stream is rendered; `data()` is the summary as plain values
(the `--json` summary object), `rows()` the same as (heading, text) lines for people.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamer.tap.sources import DELTA_FORMATS

Paint = Callable[[str, str], str]


def ms(seconds: float) -> str:
    millis = seconds * 1000
    return f"{millis:.1f}ms" if round(millis, 1) < 10 else f"{millis:.0f}ms"


def count(usage: dict[str, Any], details: str, key: str) -> Any:
    """A count inside a usage details object, which a broken stream may send in any shape."""
    inner = usage.get(details)
    return inner.get(key, 0) if isinstance(inner, dict) else 0


@dataclass(slots=True)
class Summary:
    events: int = 0
    items: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    usage: dict[str, Any] | None = None
    terminal: str | None = None
    first_t: float | None = None
    last_t: float | None = None
    violations: int = 0

    def count(self, t: float) -> None:
        """One more event, seen at `t` seconds."""
        self.events += 1
        self.first_t = t if self.first_t is None else self.first_t
        self.last_t = t

    def data(self, source_format: str | None, note: str | None, timed: bool) -> dict[str, Any]:
        usage = self.usage if isinstance(self.usage, dict) else None
        tokens = None
        if usage:
            tokens = {
                "input": usage.get("input_tokens", 0),
                "cached": count(usage, "input_tokens_details", "cached_tokens"),
                "output": usage.get("output_tokens", 0),
                "reasoning": count(usage, "output_tokens_details", "reasoning_tokens"),
                "total": usage.get("total_tokens", 0),
            }
        timed = timed and self.first_t is not None
        span = (self.last_t or 0.0) - (self.first_t or 0.0)
        return {
            "format": source_format,
            "events": self.events,
            "terminal": self.terminal,
            "items": dict(self.items),
            "calls": dict(self.calls),
            "tokens": tokens,
            "time_to_first_event": round(self.first_t or 0.0, 6) if timed else None,
            "events_per_second": round(self.events / span, 1) if timed and span > 0 else None,
            "violations": self.violations,
            "note": note,
        }


def rows(data: dict[str, Any], source_format: str | None, paint: Paint) -> list[tuple[str, str]]:
    """The summary `data()` as (heading, text) lines."""
    times = "×"  # noqa: RUF001 - a multiplication sign, on purpose
    items = ", ".join(f"{k} {times}{v}" for k, v in data["items"].items()) or "none"
    calls = ", ".join(f"{k} {times}{v}" for k, v in data["calls"].items()) or "none"
    ended = data["terminal"] or "without a terminal event"
    out = [("events", f"{data['events']} ({source_format or 'empty'}), ended {ended}")]
    out += [("deltas" if source_format in DELTA_FORMATS else "items", items), ("calls", calls)]
    if tk := data["tokens"]:
        out.append(
            (
                "tokens",
                f"input {tk['input']} (cached {tk['cached']}) · output {tk['output']} "
                f"(reasoning {tk['reasoning']}) · total {tk['total']}",
            )
        )
    if data["time_to_first_event"] is not None:
        rate = data["events_per_second"]
        timing = f"first event after {ms(data['time_to_first_event'])}"
        out.append(("timing", timing + (f" · {rate:.0f} events/s" if rate else "")))
    count = data["violations"]
    out.append(("violations", paint(str(count), "red" if count else "green")))
    return out


__all__ = ["Summary", "ms", "rows"]
