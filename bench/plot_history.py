"""CPU per turn against the history's length, one panel per mode, one line per target.

Runs in the bench-only venv (.tools/bench-venv, which has matplotlib):
    .tools/bench-venv/bin/python bench/plot_history.py bench/results/history.json out.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

TITLES = {
    "full": "HTTP, whole history each turn",
    "prev": "HTTP, previous_response_id + store",
    "ws": "WebSocket, previous_response_id",
}


def main(src: str, dst: str) -> None:
    with open(src) as f:
        result = json.load(f)
    ks, modes, names = result["k"], result["modes"], result["targets"]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 4.4), squeeze=False)
    colors = {name: f"C{i}" for i, name in enumerate(names)}
    for ax, mode in zip(axes[0], modes, strict=True):
        for name in names:
            pts = []
            for k in ks:
                cell = result["cells"].get(f"{name}|{mode}|{k}") or {}
                if cell.get("median") is not None:
                    pts.append((k, cell["median"], cell["min"], cell["max"]))
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=name, color=colors[name])
        if mode == "full":
            floor = [result["floor_ms"][str(k)] for k in ks]
            ax.plot(ks, floor, "k--", label="orjson loads + dumps")
        sends = result.get("send_ms") or {}
        if all(str(k) in sends for k in ks):
            ax.plot(ks, [sends[str(k)] for k in ks], "k:", label="send floor (Chat body)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("history items K")
        ax.set_ylabel("CPU ms per turn")
        ax.set_title(TITLES.get(mode, mode))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"CPU per turn against the history ({result['when']})")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
