"""Micro-benchmark of the naming core: `python bench/bench_tools.py [--json]`.

Converts a Codex-sized request (21 callable tools, 5 namespaces, a hosted web_search) and a
large one (1,000 namespaced tools), and times `decode` / `encode` lookups. Each figure is
the median over several batches of the time per call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from streamer.core.tools import ResponsesToolNames

OBJ = {"type": "object", "additionalProperties": False}


def _fn(name: str, description: str, **props: str) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "strict": False,
        "parameters": {
            **OBJ,
            "properties": {k: {"type": v, "description": f"The {k}."} for k, v in props.items()},
            "required": list(props),
        },
    }


def _ns(name: str, *tools: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "namespace",
        "name": name,
        "description": f"Tools in the {name} namespace.",
        "tools": list(tools),
    }


def codex_request() -> list[dict[str, Any]]:
    """Shaped like what Codex sends: plain functions, multi_agent_v1, MCP namespaces."""
    grammar = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n' * 4
    return [
        _fn("exec_command", "Runs a command in a PTY.", cmd="string", workdir="string"),
        _fn("write_stdin", "Writes characters to a session.", session_id="number", chars="string"),
        _fn("view_image", "Attach a local image.", path="string"),
        _fn("update_plan", "Updates the task plan.", explanation="string", plan="array"),
        _fn("list_mcp_resources", "Lists MCP resources.", server="string"),
        _fn("read_mcp_resource", "Reads an MCP resource.", server="string", uri="string"),
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Use the `apply_patch` tool to edit files.",
            "format": {"type": "grammar", "syntax": "lark", "definition": grammar},
        },
        _ns(
            "multi_agent_v1",
            _fn("spawn_agent", "Spawn a sub-agent.", message="string", model="string"),
            _fn("send_input", "Send input to an agent.", id="string", message="string"),
            _fn("wait", "Wait for agents.", ids="array", timeout_ms="number"),
            _fn("close_agent", "Close an agent.", id="string"),
            _fn("resume_agent", "Resume an agent.", id="string"),
        ),
        _ns(
            "mcp__docs",
            _fn("search", "Search the docs.", query="string"),
            _fn("fetch", "Fetch a page.", url="string"),
        ),
        _ns(
            "mcp__github",
            _fn("search_issues", "Search issues.", q="string"),
            _fn("get_pull_request", "Get a PR.", owner="string", repo="string", number="number"),
            _fn("create_comment", "Comment.", owner="string", repo="string", body="string"),
        ),
        _ns(
            "mcp__playwright",
            _fn("browser_navigate", "Open a URL.", url="string"),
            _fn("browser_snapshot", "Accessibility snapshot."),
        ),
        _ns(
            "mcp__codex_apps__calendar",
            _fn("_create_event", "Create an event.", title="string", start="string"),
            _fn("_list_events", "List events.", day="string"),
        ),
        {"type": "web_search"},
    ]


def large_request() -> list[dict[str, Any]]:
    """1,000 namespaced tools: 50 MCP servers of 20 tools each."""
    return [
        _ns(
            f"mcp__server_{s:02d}",
            *(
                _fn(f"tool_{t:02d}", f"Tool {t} of server {s}.", query="string", limit="number")
                for t in range(20)
            ),
        )
        for s in range(50)
    ]


def per_call_us(fn: Callable[[], object], calls: int, batches: int) -> float:
    """Median over `batches` of the mean time per call, in microseconds."""
    fn()  # warm up
    samples = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - start) / calls / 1000)
    return statistics.median(samples)


def run() -> dict[str, Any]:
    codex, large = codex_request(), large_request()
    names_codex = ResponsesToolNames.convert(codex)
    names_large = ResponsesToolNames.convert(large)
    flats = [t.name for t in names_large.tools]
    decode = names_large.decode

    def decode_all() -> None:
        for f in flats:
            decode(f)

    def encode_all() -> None:
        for t in names_large.tools:
            names_large.encode(t.identity.namespace, t.identity.name)

    n = len(flats)
    results: dict[str, Any] = {
        "codex_tools": len(names_codex),
        "codex_namespaces": sum(1 for t in codex if t["type"] == "namespace"),
        "large_tools": len(names_large),
        "convert_codex_us": per_call_us(lambda: ResponsesToolNames.convert(codex), 300, 15),
        "convert_large_us": per_call_us(lambda: ResponsesToolNames.convert(large), 5, 9),
        "decode_hit_us": per_call_us(decode_all, 20, 9) / n,
        "decode_miss_us": per_call_us(lambda: decode("not_a_tool"), 20_000, 9),
        "encode_hit_us": per_call_us(encode_all, 5, 9) / n,
        "resolve_choice_codex_us": per_call_us(
            lambda: ResponsesToolNames.convert(codex).resolve_choice(
                {"type": "function", "name": "search"}
            ),
            300,
            9,
        ),
    }
    results["python"] = sys.version.split()[0]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    r = run()
    if args.json:
        print(orjson.dumps(r).decode())
        return
    print(f"convert, Codex-sized ({r['codex_tools']} tools, {r['codex_namespaces']} namespaces):")
    print(f"  {r['convert_codex_us']:10.1f} us/request")
    print(f"  {r['resolve_choice_codex_us']:10.1f} us/request incl. resolve_choice (bare name)")
    print(f"convert, large ({r['large_tools']} namespaced tools):")
    print(f"  {r['convert_large_us']:10.1f} us/request")
    print(f"decode (hit):     {r['decode_hit_us'] * 1000:8.1f} ns/call")
    print(f"decode (miss):    {r['decode_miss_us'] * 1000:8.1f} ns/call")
    print(f"encode (history): {r['encode_hit_us'] * 1000:8.1f} ns/call")


if __name__ == "__main__":
    main()
