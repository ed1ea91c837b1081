"""A correctness probe of one gateway: a namespaced tool through it, and what comes back.

One streamed and one non-streamed request, each with the load client's tools (the namespace
`mcp__bench` with `lookup` first, the function `echo` second). For each it records what the
backend was sent (the path and the tools, from the load backend's `GET /last`), and what the
client got: the events by type, how many text deltas arrived as separate events (N of them:
it streams token by token), the function call's `name` and `namespace` in
`response.output_item.done` and in `response.completed` (restored, flattened, or dotted), and
the status. Plain facts for the report, not a benchmark.

    python bench/probe_responses.py --url http://127.0.0.1:9000 --backend http://127.0.0.1:8900
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from collections import Counter
from typing import Any

from load_client import request_body

_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post(url: str, body: dict[str, Any], api_key: str, timeout: float) -> tuple[int, bytes, float]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    t0 = time.monotonic()
    try:
        with _LOCAL.open(req, timeout=timeout) as resp:
            return resp.status, resp.read(), time.monotonic() - t0
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), time.monotonic() - t0


def sse_objects(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(ln[5:].lstrip() for ln in block.split(b"\n") if ln.startswith(b"data:"))
        if data and data != b"[DONE]":
            try:
                out.append(json.loads(data))
            except json.JSONDecodeError:
                out.append({"type": "<unparsable>"})
    return out


def _call(item: dict[str, Any]) -> dict[str, Any]:
    keys = ("type", "name", "namespace")
    return {k: item.get(k) for k in keys if k in item} | {"arguments_ok": _json_obj(item)}


def _json_obj(item: dict[str, Any]) -> bool:
    try:
        return isinstance(json.loads(item.get("arguments") or ""), dict)
    except (json.JSONDecodeError, TypeError):
        return False


def _calls(output: list[Any]) -> list[dict[str, Any]]:
    return [_call(i) for i in output if isinstance(i, dict) and i.get("type") == "function_call"]


def _upstream(backend: str) -> dict[str, Any]:
    """What the backend was sent: the path and the tools (type, name, namespace members)."""
    with _LOCAL.open(backend.rstrip("/") + "/last", timeout=5) as resp:
        last = json.loads(resp.read())
    body = last.get("body") or {}
    tools = []
    for t in body.get("tools") or []:
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        entry = {"type": t.get("type"), "name": fn.get("name")}
        if t.get("type") == "namespace":
            entry["tools"] = [x.get("name") for x in t.get("tools") or []]
        tools.append(entry)
    keys = sorted(k for k in body if k not in ("input", "messages", "tools"))
    return {"path": last.get("path"), "tools": tools, "fields": keys}


def probe_stream(url: str, backend: str, api_key: str, timeout: float) -> dict[str, Any]:
    status, raw, took = _post(url + "/v1/responses", request_body("bench", False), api_key, timeout)
    events = sse_objects(raw)
    kinds = Counter(str(e.get("type")) for e in events)
    done = [e["item"] for e in events if e.get("type") == "response.output_item.done"]
    final = next((e for e in reversed(events) if e.get("type") == "response.completed"), None)
    out: dict[str, Any] = {"status": status, "seconds": round(took, 4), "events": len(events)}
    out["text_delta_events"] = kinds.get("response.output_text.delta", 0)
    out["argument_delta_events"] = kinds.get("response.function_call_arguments.delta", 0)
    out["event_types"] = dict(kinds)
    out["call_in_item_done"] = _calls(done)
    out["call_in_completed"] = _calls((final or {}).get("response", {}).get("output", []))
    if final is None:
        out["tail"] = raw[-300:].decode(errors="replace")
    out["upstream"] = _upstream(backend)
    return out


def probe_json(url: str, backend: str, api_key: str, timeout: float) -> dict[str, Any]:
    body = {k: v for k, v in request_body("bench", False).items() if k != "stream"}
    status, raw, took = _post(url + "/v1/responses", body, api_key, timeout)
    out: dict[str, Any] = {"status": status, "seconds": round(took, 4)}
    try:
        obj = json.loads(raw)
        out["calls"] = _calls(obj.get("output") or [])
        out["response_status"] = obj.get("status")
    except (json.JSONDecodeError, AttributeError):
        out["body"] = raw[:300].decode(errors="replace")
    out["upstream"] = _upstream(backend)
    return out


def probe(url: str, backend: str, api_key: str = "", timeout: float = 30.0) -> dict[str, Any]:
    """Both probes; an error in one is recorded, not raised."""
    result: dict[str, Any] = {}
    for key, fn in (("stream", probe_stream), ("json", probe_json)):
        try:
            result[key] = fn(url, backend, api_key, timeout)
        except (OSError, ValueError) as exc:
            result[key] = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def verdict(p: dict[str, Any], n: int) -> str:
    """One line for the report: restored? streams? what the backend was sent."""
    s, j = p.get("stream", {}), p.get("json", {})
    if "error" in s:
        return "probe failed: " + s["error"]
    calls = s.get("call_in_completed") or []
    call = calls[0] if calls else {}
    restored = call.get("name") == "lookup" and call.get("namespace") == "mcp__bench"
    got = f"name={call.get('name')!r} namespace={call.get('namespace')!r}" if call else "no call"
    streams = s.get("text_delta_events") == n
    sent = ", ".join(
        str(t.get("name")) + ("(namespace)" if t.get("tools") else "")
        for t in s.get("upstream", {}).get("tools", [])
    )
    jcalls = j.get("calls") or []
    jtext = (
        f"name={jcalls[0].get('name')!r} namespace={jcalls[0].get('namespace')!r}"
        if jcalls
        else (j.get("error") or j.get("body") or f"HTTP {j.get('status')}, no call")
    )
    return (
        f"namespace {'restored' if restored else 'NOT restored'} ({got}); "
        f"{'streams' if streams else 'does not stream token by token'} "
        f"({s.get('text_delta_events')} text deltas for N = {n}, {s.get('events')} events); "
        f"non-streamed: {jtext}; backend was sent `{s.get('upstream', {}).get('path')}` "
        f"with tools [{sent}] and fields [{', '.join(s.get('upstream', {}).get('fields', []))}]"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", required=True, help="the gateway's base URL")
    p.add_argument("--backend", required=True, help="the load backend's base URL")
    p.add_argument("--api-key", default="")
    p.add_argument("--n", type=int, default=200, help="the backend's N (for the verdict)")
    args = p.parse_args()
    result = probe(args.url.rstrip("/"), args.backend, args.api_key)
    print(json.dumps(result, indent=1))
    print(verdict(result, args.n))


if __name__ == "__main__":
    main()
