"""CPU per turn of the gateway's own per-turn path, tracing off and on.

A whole `Gateway` (as `create_app` starts it: router, observed memory store, metrics)
runs JSON turns against an in-process backend that hands over prebuilt batches (N text
deltas, finish, usage: no socket), `prepare` then `Gateway.run`: everything a turn costs
the gateway but the HTTP framing. Modes, interleaved in one run, the median of the
repeats of `--turns` turns each:

- `off`: no `OTEL_*` (the default);
- `on`: the SDK's TracerProvider with a BatchSpanProcessor whose exporter encodes every
  batch to OTLP protobuf and drops it (what OTLP/HTTP costs but the POST), flushed inside
  the timed block; CPU of the process (the export thread included).

The off path against main: run this file with `PYTHONPATH=<main's tree>` (only `off`
runs there) and compare, alternated; `--once K` runs K turns (tracing off) and exits, for
`valgrind --tool=callgrind` (the difference of K=400 and K=0 is K turns' instructions).

    python bench/bench_tracing.py [--turns 200] [--repeat 15] [--n 20] [--modes off on]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from streamer.app import create_app
from streamer.config import Settings
from streamer.core.batch import Batch
from streamer.core.deltas import Finish, TextDelta, Usage
from streamer.frontends.http import GATEWAY
from streamer.turns.turn_runner import JSONSink

BODY = {"model": "bench", "input": "hi", "max_output_tokens": 100}


class _Stream(AsyncIterator[Batch]):
    """The batches, as a backend stream gives them (a class: no async generator to finalise)."""

    __slots__ = ("_batches", "first")

    def __init__(self, batches: list[Batch]) -> None:
        self.first = None
        self._batches = iter(batches)

    def __aiter__(self) -> AsyncIterator[Batch]:
        return self

    async def __anext__(self) -> Batch:
        for batch in self._batches:
            return batch
        raise StopAsyncIteration

    async def aclose(self) -> None:
        return None


class Backend:
    """An upstream whose answer is `n` one-delta batches, then finish and usage."""

    def __init__(self, n: int) -> None:
        self.n = n

    async def open(self, backend_request: dict[str, Any], **kwargs: Any) -> _Stream:
        batches = [Batch([TextDelta("tok ")]) for _ in range(self.n)]
        batches.append(Batch([Finish("stop"), Usage(5, self.n)], end=True))
        return _Stream(batches)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def _tracing_on() -> Any:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from streamer import tracing

    class Encoding(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Encoding()))
    return tracing, provider


async def _gateway(n: int) -> tuple[Any, Any]:
    settings = Settings(upstream="http://127.0.0.1:9/v1", profile_probe=False, fast_http=False)
    app = create_app(settings)
    app.freeze()
    await app.startup()
    gateway = app[GATEWAY]
    gateway.upstreams.router.table.order[0].replicas[0].backend = Backend(n)
    return app, gateway


async def turns(gateway: Any, k: int) -> None:
    for _ in range(k):
        turn = await gateway.prepare(dict(BODY))
        await gateway.run(turn, JSONSink(), "json")


async def _timed(gateway: Any, k: int, mode: str, on: Any) -> float:
    """CPU µs per turn of `k` turns in `mode`."""
    if mode == "on":
        on[0].install(on[1])
    start = time.process_time_ns()
    await turns(gateway, k)
    if mode == "on":
        on[1].force_flush()
        on[0].install(None)
    return (time.process_time_ns() - start) / k / 1000


async def main(args: argparse.Namespace) -> None:
    app, gateway = await _gateway(args.n)
    if args.once is not None:
        await turns(gateway, args.once)
        await app.cleanup()
        return
    on = _tracing_on() if "on" in args.modes else None
    await turns(gateway, args.turns)  # warm
    times: dict[str, list[float]] = {mode: [] for mode in args.modes}
    for _ in range(args.repeat):
        for mode in args.modes:
            times[mode].append(await _timed(gateway, args.turns, mode, on))
    await app.cleanup()
    medians = {mode: statistics.median(t) for mode, t in times.items()}
    for mode, median in medians.items():
        print(f"{mode:4} {median:8.1f} µs CPU per turn (n={args.n})")
    if "off" in medians and "on" in medians:
        print(f"on/off {medians['on'] / medians['off']:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--n", type=int, default=20, help="text deltas per turn")
    parser.add_argument("--modes", nargs="+", default=["off", "on"])
    parser.add_argument("--once", type=int, default=None)
    asyncio.run(main(parser.parse_args()))
