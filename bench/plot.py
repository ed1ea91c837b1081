"""Events/s against concurrency, one line per gateway, the raw relay as the ceiling.

Runs in the bench-only venv (.tools/bench-venv, which has matplotlib):
    .tools/bench-venv/bin/python bench/plot.py bench/results/bench.json bench/results/bench.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, NullFormatter


def _human(v: float, _pos: int = 0) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def main(src: str, dst: str) -> None:
    with open(src) as f:
        result = json.load(f)
    cells = result["cells"]
    ns = sorted({c["n"] for c in cells})
    fig, axes = plt.subplots(1, len(ns), figsize=(5.2 * len(ns), 4.4), squeeze=False)
    names = list(dict.fromkeys(_label(c) for c in cells))
    colors = {name: f"C{i}" for i, name in enumerate(n for n in names if "raw relay" not in n)}
    colors["raw relay"] = "black"
    for ax, n in zip(axes[0], ns, strict=True):
        for name in names:
            pts = sorted(
                (c["c"], c["median"]["events_per_s"])
                for c in cells
                if _label(c) == name and c["n"] == n and c["median"]["events_per_s"]
            )
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            relay = name.startswith("raw relay")
            ax.plot(
                xs,
                ys,
                marker="o",
                label=name + (" (ceiling)" if relay else ""),
                linestyle="--" if relay else "-",
                color=("black" if name == "raw relay" else "gray") if relay else None,
                linewidth=2 if name.startswith("streamer") else 1.3,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(_human))
        lo, hi = ax.get_ylim()
        if hi / lo <= 20:  # label the minor ticks only when there are few decades
            ax.yaxis.set_minor_formatter(FuncFormatter(_human))
            ax.tick_params(axis="y", which="minor", labelsize=7)
        else:
            ax.yaxis.set_minor_formatter(NullFormatter())
        cs = sorted({c["c"] for c in cells})
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrent streams")
        ax.set_title(f"N = {n} text deltas")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("events per second (log)")
    axes[0][-1].legend(fontsize=8, loc="best")
    meta = result["meta"]
    runs = meta["settings"]["runs"]
    fig.suptitle(
        f"streamer benchmark, {meta['started']}: events/s, median of {runs} run(s)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


def _label(cell: dict) -> str:
    return cell["target"] + (" (ws)" if cell["transport"] == "ws" else "")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
