"""What /proc says about a process tree: CPU time, peak RSS, who listens on a port."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: split after its closing one
    return raw[raw.rfind(")") + 2 :].split()


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            kids.setdefault(int(fields[1]), []).append(int(entry.name))
    return kids


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants that are alive now."""
    kids = children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (all threads), in seconds."""
    total = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mb(pids: list[int]) -> float:
    """Sum of VmHWM (peak resident set) over the processes, in MB (10^6 bytes)."""
    return sum(_status_kb(p, "VmHWM:") for p in pids) * 1024 / 1e6


def rss_mb(pids: list[int]) -> float:
    return sum(_status_kb(p, "VmRSS:") for p in pids) * 1024 / 1e6


def reset_peak_rss(pids: list[int]) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    ok = True
    for pid in pids:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            ok = False
    return ok


def pids_listening_on(port: int) -> list[int]:
    """The processes that hold a listening TCP socket on `port` (as far as /proc shows them),
    without those whose parent holds it too: the roots of the server's process trees."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    holders: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                try:
                    if os.readlink(fd.path) in wanted:
                        fields = _stat_fields(int(entry.name))
                        holders[int(entry.name)] = int(fields[1]) if fields else 0
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return sorted(p for p, parent in holders.items() if parent not in holders)


def busy_seconds() -> dict[str, float]:
    """CPU time spent by everything, not idle or iowait: `machine` (all cores) and `core<i>`."""
    out: dict[str, float] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if not line.startswith("cpu"):
            break
        cols = line.split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in cols[1:9])
        name = "machine" if cols[0] == "cpu" else "core" + cols[0][3:]
        out[name] = (user + nice + system + irq + softirq + steal) / TICK
    return out
