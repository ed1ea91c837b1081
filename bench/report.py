"""Turn the runs of a benchmark into medians per cell, and those into JSON, Markdown and a plot."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

import fresh_probes
from targets import ROOT

BENCH_VENV_PY = ROOT / ".tools" / "bench-venv" / "bin" / "python"


def _get(run: dict[str, Any], path: str) -> float | None:
    cur: Any = run
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return float(cur) if isinstance(cur, int | float) else None


MEDIAN_KEYS = (
    "events_per_s",
    "requests_per_s",
    "mb_per_s",
    "ttfb_ms.p50",
    "ttfb_ms.p99",
    "first_text_ms.p50",
    "first_text_ms.p99",
    "latency_ms.p50",
    "latency_ms.p99",
    "target_cpu_util",
    "cpu_us_per_event",
    "peak_rss_mb",
    "client_cpu_util",
    "backend_cpu_util",
    "others_cpu_util",
    "gateway_core_others",
)


def cell_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure the median over the runs; counts summed; the namespace verdict combined."""
    out: dict[str, Any] = {"runs": len(runs)}
    for key in MEDIAN_KEYS:
        values = [v for r in runs if (v := _get(r, key)) is not None]
        out[key] = statistics.median(values) if values else None
    out["failures"] = sum(r["failures"] for r in runs)
    kinds: dict[str, int] = {}
    for r in runs:
        for k, v in r["failure_kinds"].items():
            kinds[k] = kinds.get(k, 0) + v
    out["failure_kinds"] = kinds
    verdicts = {r["namespace"] for r in runs}
    out["namespace"] = next(
        (v for v in ("no", "yes", "n/a") if v in verdicts), "unknown"
    )  # "no" anywhere wins: one unrestored call is a failure of the feature
    bad: dict[str, int] = {}
    for r in runs:
        for k, v in r["namespace_bad"].items():
            bad[k] = bad.get(k, 0) + v
    out["namespace_bad"] = bad
    out["requests_estimated"] = any(r.get("requests_estimated") for r in runs)
    out["load_bound"] = any(r.get("load_bound") for r in runs)
    out["contended"] = any((r.get("gateway_core_others") or 0) >= 0.1 for r in runs)
    return out


def add_ratios(cells: list[dict[str, Any]]) -> None:
    """Ratio of requests/s (and events/s) to the raw relay's in the same cell of this run
    (the relay of the same upstream API: Chat, Responses or Anthropic Messages)."""
    relay = {(c["target"], c["n"], c["c"]): c for c in cells if c.get("kind") == "baseline"}
    for cell in cells:
        base = relay.get((cell.get("relay", "raw relay"), cell["n"], cell["c"]))
        for key, out in (("requests_per_s", "ratio"), ("events_per_s", "ratio_events")):
            a = cell["median"].get(key)
            b = base["median"].get(key) if base else None
            cell["median"][out] = a / b if a is not None and b else None


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def _req(median: dict[str, Any], digits: int) -> str:
    text = _fmt(median.get("requests_per_s"), digits)
    return "≈" + text if median.get("requests_estimated") else text


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def _ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 0.1 else f"{x:.2f}"


def label(cell: dict[str, Any]) -> str:
    return cell["target"] + (" (ws)" if cell["transport"] == "ws" else "")


def _probe_lines(probes: dict[str, Any]) -> list[str]:
    """What a namespaced tool through each gateway came back as (probe_responses.py)."""
    if not probes:
        return []
    lines = ["## A namespaced tool through each gateway (probe)", ""]
    lines += [f"- **{name}**: {p['verdict']}" for name, p in probes.items()]
    return [*lines, ""]


def markdown(result: dict[str, Any]) -> str:
    meta, cells = result["meta"], result["cells"]
    s = meta["settings"]
    lines = [
        f"# streamer benchmark: {meta['started']}",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}  ",
        f"Pinning: {meta['pinning']}  ",
        *([f"Note: {meta['note']}  "] if meta.get("note") else []),
        f"Each figure is the median of {s['runs']} run(s) of {s['duration']} s after "
        f"{s['warmup']} s of warm-up; M = {s['m']} argument fragments; ratios are to the raw "
        "relay measured in the same cell of this run (requests/s); for the /v1/responses rows "
        "(the gateway with `--upstream-api responses`, agentic-api) to `raw relay (responses)`, "
        "the relay of the backend's Responses stream; for `streamer (anthropic)` to `raw relay "
        "(messages)`, the relay of the backend's Anthropic Messages stream.",
        "",
    ]
    ns = [n for n in s["n"] if any(c["n"] == n for c in cells)]
    if ns:
        n0 = 200 if 200 in ns else ns[0]
        cs = s["concurrency"]
        lines += [f"## Summary (N = {n0} text deltas)", ""]
        head = "| gateway | req/s " + " / ".join(f"c={c}" for c in cs)
        head += f" | events/s c={cs[-1]} | ratio to raw relay c={cs[-1]} | first text p50 c={cs[0]} (ms)"
        head += f" | peak RSS c={cs[-1]} (MB) | namespace restored |"
        lines += [head, "|" + "---|" * 7]
        for name in dict.fromkeys(label(c) for c in cells):
            row = {c["c"]: c["median"] for c in cells if label(c) == name and c["n"] == n0}
            if not row:
                continue
            last, first = row.get(cs[-1], {}), row.get(cs[0], {})
            verdicts = {c["median"]["namespace"] for c in cells if label(c) == name}
            verdict = "no" if "no" in verdicts else "yes" if "yes" in verdicts else "n/a"
            lines.append(
                f"| {name} | "
                + " / ".join(_req(row.get(c, {}), 0) for c in cs)
                + f" | {_fmt(last.get('events_per_s'))} | {_ratio(last.get('ratio'))}"
                + f" | {_ms(first.get('first_text_ms.p50'))} | {_fmt(last.get('peak_rss_mb'), 1)}"
                + f" | {verdict} |"
            )
        for t in result["targets"]:  # rows that could not be measured, and why
            if t["status"] != "ok" and t["transport"] == "sse":
                lines.append(f"| {t['name']} | {t['status']}: {t['reason']} |" + " - |" * 5)
        lines.append("")
    lines += fresh_probes.markdown(result.get("fresh"))
    lines += _probe_lines(result.get("probes") or {})
    lines += [
        "## Every cell",
        "",
        "| N | c | gateway | events/s | req/s | TTFB p50 / p99 (ms) | first text p50 (ms) "
        "| latency p50 / p99 (ms) | CPU (% of a core) | CPU µs/event | peak RSS (MB) "
        "| ratio to raw relay | namespace | failures |",
        "|" + "---|" * 14,
    ]
    for cell in sorted(cells, key=lambda c: (c["n"], c["c"], c["order"])):
        m = cell["median"]
        flag = (" ⚑" if m["load_bound"] else "") + (" ‡" if m.get("contended") else "")
        cpu = m["target_cpu_util"]
        lines.append(
            f"| {cell['n']} | {cell['c']} | {label(cell)} | {_fmt(m['events_per_s'])}{flag}"
            f" | {_req(m, 1)} | {_ms(m['ttfb_ms.p50'])} / {_ms(m['ttfb_ms.p99'])}"
            f" | {_ms(m['first_text_ms.p50'])} | {_ms(m['latency_ms.p50'])} / "
            f"{_ms(m['latency_ms.p99'])} | {_fmt(cpu * 100 if cpu is not None else None)}"
            f" | {_fmt(m['cpu_us_per_event'], 1)} | {_fmt(m['peak_rss_mb'], 1)}"
            f" | {_ratio(m['ratio'])} | {m['namespace']} | {m['failures'] or ''} |"
        )
    lines += [
        "",
        "⚑: the load core(s) were saturated during a run (by the client and backend, or by "
        "other processes), so this figure is a lower bound of what the target can do. "
        "‡: other processes on the machine took 10% or more of the gateway core during a run, "
        "so this figure may be low. ≈: fewer requests ended in the window than there are "
        "streams, so requests/s is events/s divided by the events of one response. "
        "Events are what the client received: Responses events for the gateways, Chat chunks "
        "for the raw relay, Responses events for the raw relay (responses), Messages events "
        "for the raw relay (messages).",
        "",
        "## Targets",
        "",
    ]
    for t in result["targets"]:
        extra = f" ({t['version']})" if t["version"] else ""
        why = f": {t['reason']}" if t["reason"] else ""
        lines.append(
            f"- **{t['name']}** [{t['kind']}, {t['transport']}]{extra}: {t['status']}{why}"
        )
    failing = [c for c in cells if c["median"]["failures"] or c["median"]["namespace_bad"]]
    if failing:
        lines += ["", "## Failures and unrestored calls", ""]
        for c in failing:
            m = c["median"]
            lines.append(
                f"- {label(c)} N={c['n']} c={c['c']}: {m['failure_kinds'] or ''} "
                f"{m['namespace_bad'] or ''}"
            )
    for name, extra in result.get("extras", {}).items():
        lines += ["", f"## {name}", "", f"Status: {extra['status']}", ""]
        if extra.get("output"):
            lines += ["```text", extra["output"].rstrip(), "```"]
    if result.get("plot"):
        lines += ["", f"![events/s against concurrency]({Path(result['plot']).name})"]
    elif result.get("plot_note"):
        lines += ["", f"Plot: {result['plot_note']}"]
    return "\n".join(lines) + "\n"


def plot(json_path: Path, png_path: Path) -> str:
    """Draw the plot with the bench venv's matplotlib; '' when done, else why not."""
    if not BENCH_VENV_PY.exists():
        return "skipped: no .tools/bench-venv (scripts/install-peers.sh plot installs matplotlib)"
    try:
        out = subprocess.run(
            [
                str(BENCH_VENV_PY),
                str(Path(__file__).with_name("plot.py")),
                str(json_path),
                str(png_path),
            ],
            capture_output=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return "skipped: plotting timed out"
    if out.returncode != 0:
        return "skipped: plotting failed: " + out.stderr.decode()[-300:]
    return ""


def write(result: dict[str, Any], out_dir: Path, name: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{name}.json", "md": out_dir / f"{name}.md"}
    png = out_dir / f"{name}.png"
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    note = plot(paths["json"], png)
    if note:
        result["plot_note"] = note
        result.pop("plot", None)
    else:
        png = png.resolve()
        result["plot"] = str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
        paths["png"] = png
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["md"].write_text(markdown(result))
    return paths
