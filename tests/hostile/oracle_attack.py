"""Row 1 of issue 25: the secret scrubber as an oracle, attacked by a client that can only
make the model repeat what it says.

The gateway runs in front of the embedded scripted model, which answers `You said: <input>`
word by word. An attacking client sends candidate strings and reads everything a client
can read: the text, the `[redacted]` markers, and when streaming, where each
`response.output_text.delta` starts and ends. A scrubber that treats a *partial* match of
a secret differently from no match (holds back a tail that could start a key, redacts a
long held tail at the end) makes one candidate out of the alphabet look different: that
candidate is one more character of a key. Without such a difference the attacker learns
nothing, however many turns it spends.

The attack, per round: take the longest prefix known (from nothing, or from a public prefix
such as `sk-proj-`), send `<glue><prefix><c>` for every character `c` of the alphabet, and
keep every candidate whose observation (delta lengths, the text with the candidate masked)
differs from what most of them got. When no candidate stands out, the next round tries the
same prefix behind another glue, until the budget of turns is spent.

    python tests/hostile/oracle_attack.py [--turns 10000] [--json]

runs every variant (streamed deltas from nothing, non-streaming from the public prefix;
anonymous, and a tenant of two `--api-key`s) against this tree and prints the characters of
each key it learnt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import string
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from streamer.app import create_app
from streamer.config import Settings
from streamer.frontends.frontdoor import GuardedSite
from streamer.scripted_model import start_scripted_model

ALPHABET = string.ascii_letters + string.digits + "-_"
PUBLIC_PREFIX = "sk-proj-"  # what every OpenAI project key starts with
UPSTREAM_KEY = "sk-proj-UpStreamKey0123456789abcdefXYZ"
TENANT_A = "sk-proj-TenantA-q8Zr2LmN0pW4xY7v"  # the attacker's own key
TENANT_B = "sk-proj-TenantB-K3dF9sJ1hG5tR8wE"  # the other tenant's
GLUES = ("Q", "zz", "", "Q.", "x=", "7", "Q_", "(")  # what the candidate is glued behind
CONCURRENCY = 16


@dataclass(frozen=True)
class Variant:
    name: str
    stream: bool  # read the SSE deltas (else the non-streaming JSON answer)
    start: str  # the prefix the attacker starts from ("" or a public one)
    tenants: bool  # the gateway has --api-key A and B and the attacker is A


VARIANTS = (
    Variant("stream, from nothing, anonymous", True, "", False),
    Variant("stream, from nothing, tenant A", True, "", True),
    Variant("json, from sk-proj-, anonymous", False, PUBLIC_PREFIX, False),
    Variant("json, from sk-proj-, tenant A", False, PUBLIC_PREFIX, True),
)


@dataclass
class Result:
    variant: Variant
    turns: int = 0
    learnt: dict[str, int] = field(default_factory=dict)  # target key -> characters learnt
    concluded: set[str] = field(default_factory=set)  # every prefix the attacker believed in
    differing: int = 0  # observations unlike the rest of their round's: what leaks, at all
    when: dict[str, int] = field(default_factory=dict)  # a concluded prefix -> turns spent by then

    @property
    def total(self) -> int:
        return sum(self.learnt.values())


def targets(variant: Variant) -> tuple[str, ...]:
    """The keys the attacker does not hold: the upstream key, and the other tenant's."""
    return (UPSTREAM_KEY, TENANT_B) if variant.tenants else (UPSTREAM_KEY,)


def score(result: Result) -> None:
    """Characters of each target learnt: the longest concluded prefix that truly starts it,
    beyond where the attack started (a wrong conclusion teaches nothing)."""
    start = len(result.variant.start)
    for key in targets(result.variant):
        right = [len(p) for p in result.concluded if key.startswith(p)]
        result.learnt[key] = max([start, *right]) - start


def turns_to(result: Result, key: str) -> int | None:
    """Turns the attack had spent when it had learnt all it learnt of `key`."""
    best = max((p for p in result.concluded if key.startswith(p)), key=len, default=None)
    return None if best is None else result.when[best]


@contextlib.asynccontextmanager
async def gateway(variant: Variant) -> AsyncIterator[str]:
    """A real gateway on loopback in front of the embedded scripted model: its base URL."""
    model, model_url = await start_scripted_model()
    settings = Settings(
        upstream=model_url,
        upstream_api_key=UPSTREAM_KEY,
        api_keys=(TENANT_A, TENANT_B) if variant.tenants else (),
        profile_probe=False,
    )
    runner = web.AppRunner(create_app(settings), handler_cancellation=True)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site.port}/v1"
    finally:
        await runner.cleanup()
        await model.cleanup()


async def observe(http: aiohttp.ClientSession, url: str, probe: str, stream: bool) -> Any:
    """What a client sees of the echo of `probe`, with `probe` itself masked: the delta
    lengths and the text (streamed), or the text (non-streaming)."""
    body = {"model": "m", "input": probe, "stream": stream, "store": False}
    async with http.post(url + "/responses", json=body) as resp:
        raw = await resp.read()
        assert resp.status == 200, raw[:500]
    if not stream:
        answer = orjson.loads(raw)
        text = "".join(
            part.get("text", "")
            for item in answer["output"]
            if item["type"] == "message"
            for part in item["content"]
        )
        return masked(text, probe)
    deltas = []
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                event = orjson.loads(line[6:])
                if event["type"] == "response.output_text.delta":
                    deltas.append(event["delta"])
    return tuple(map(len, deltas)), masked("".join(deltas), probe)


def masked(text: str, probe: str) -> str:
    """The echo with the probe (its end) masked, so that only what the gateway did differs."""
    return text[: -len(probe)] + "#" * len(probe) if probe and text.endswith(probe) else text


def held(seen: Any, glue: str, candidate: str) -> bool:
    """A streamed observation whose last word came in two deltas cut right behind the glue:
    the candidate was held back whole (and not only a suffix of it, such as a final `s`),
    and came out as it was or as a marker."""
    lengths, text = seen
    marked = text.endswith(f" {glue}[redacted]")
    if not glue or len(lengths) < 2:
        return False
    return lengths[-2] == len(glue) and (lengths[-1] == len(candidate) or marked)


async def attack(variant: Variant, budget: int) -> Result:
    """Spend up to `budget` turns learning keys through the scrubber; score what was learnt."""
    result = Result(variant)
    headers = {"Authorization": f"Bearer {TENANT_A}"} if variant.tenants else {}
    limit = asyncio.Semaphore(CONCURRENCY)
    async with (
        gateway(variant) as url,
        aiohttp.ClientSession(headers=headers) as http,
    ):

        async def one(probe: str) -> Any:
            async with limit:
                return await observe(http, url, probe, variant.stream)

        stack = [variant.start]  # prefixes to extend, the deepest last
        believed = {variant.start}
        rounds: Counter[str] = Counter()  # rounds already spent on a prefix
        while result.turns + len(ALPHABET) <= budget:
            prefix = stack[-1]
            n = rounds[prefix]
            rounds[prefix] += 1
            glue = GLUES[n % len(GLUES)] + "Q" * (n // len(GLUES))
            candidates = [prefix + c for c in ALPHABET]
            seen = await asyncio.gather(*(one(glue + c) for c in candidates))
            result.turns += len(candidates)
            common, _ = Counter(seen).most_common(1)[0]
            odd = [c for c, s in zip(candidates, seen, strict=True) if s != common]
            result.differing += len(odd)
            if variant.stream:  # where the scrubber cut: right behind the glue, or a suffix
                odd = [c for c, s in zip(candidates, seen, strict=True) if held(s, glue, c)]
            result.concluded.update(odd)
            result.when.update((p, result.turns) for p in odd if p not in result.when)
            new = [p for p in odd if p not in believed]
            believed.update(new)
            if new:
                stack.extend(new)
            elif len(stack) > 1:
                stack.pop()  # nothing new behind this prefix: back to a branch left behind
            # else: the only prefix left; the next round tries it behind another glue
    score(result)
    return result


async def run_all(budget: int, variants: Sequence[Variant] = VARIANTS) -> list[Result]:
    return [await attack(variant, budget) for variant in variants]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000, help="turns per variant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = asyncio.run(run_all(args.turns))
    if args.json:
        rows = [
            {
                "variant": r.variant.name,
                "turns": r.turns,
                "differing": r.differing,
                "learnt": r.learnt,
            }
            for r in results
        ]
        sys.stdout.write(orjson.dumps(rows).decode() + "\n")
        return 0
    for r in results:
        keys = ", ".join(
            f"{key[:12]}…: {n} of {len(key) - len(r.variant.start)}"
            + (f" by turn {turns_to(r, key)}" if n else "")
            for key, n in r.learnt.items()
        )
        print(
            f"{r.variant.name:<34} {r.turns:>6} turns, {r.differing} observations unlike "
            f"their round's, key characters learnt: {r.total} ({keys})"
        )
    print(f"total key characters learnt: {sum(r.total for r in results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
