"""What an operator installs: the distribution, its command, its lock, its service files.

The distribution is `streamer-gateway` (`streamer` on PyPI is another project); the import
name and `python -m streamer` stay. The systemd unit is checked by running its own
ExecStart and ExecReload lines against the package installed here.
"""

from __future__ import annotations

import asyncio
import configparser
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import aiohttp
import pytest
from builders import free_port
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import streamer
from streamer.config import SETTINGS

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = version
    return pins


def test_the_version_command_names_the_distribution() -> None:
    for argv in (["-m", "streamer", "--version"], ["-m", "streamer", "serve", "--version"]):
        out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"streamer-gateway {streamer.__version__}"


def test_the_lock_pins_every_dependency_and_extra() -> None:
    pins = _pins()
    wanted = [*PROJECT["dependencies"]]
    for extra in PROJECT["optional-dependencies"].values():
        wanted += extra
    missing = []
    for spec in wanted:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        if name not in pins or not req.specifier.contains(pins[name], prereleases=True):
            missing.append(f"{spec} (lock: {pins.get(name)})")
    assert not missing, "requirements.lock is out of date (scripts/lock.sh): " + ", ".join(missing)
    assert "streamer-gateway" not in pins and "streamer" not in pins


def test_pip_builds_the_wheel_from_a_clean_checkout(tmp_path: Path) -> None:
    """`pip install .` needs nothing but the tracked files (no make, no .venv)."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    src = tmp_path / "src"
    for name in filter(None, files):
        path = REPO / os.fsdecode(name)
        if path.is_file() and not path.is_symlink():
            target = src / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
         str(src)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith(f"streamer_gateway-{streamer.__version__}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "Name: streamer-gateway\n" in archive.read(meta).decode()
        assert "streamer = streamer.cli:main" in archive.read(entry).decode()
    assert "streamer/__main__.py" in names and "streamer/core/output.py" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "streamer-gateway.service")
    return unit


def _env_file() -> dict[str, str]:
    env = {}
    for line in (DEPLOY / "streamer.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def test_the_unit_leaves_the_drain_its_time_and_the_gateway_its_fds() -> None:
    service = _unit()["Service"]
    grace = next(s.default for s in SETTINGS if s.dest == "shutdown_grace")
    assert float(service["TimeoutStopSec"]) > grace  # SIGKILL only after the drain had its time
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["LimitNOFILE"]) >= 65536
    assert set(_env_file()) <= {s.env for s in SETTINGS}  # the example names real settings


def test_the_dockerfile_runs_unprivileged_with_a_healthcheck() -> None:
    """Not built here (no image registry on this machine); its promises are checked."""
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    assert any("/healthz" in line for line in lines)
    assert any("-c /src/requirements.lock" in line for line in lines)


async def _healthy(url: str, proc: asyncio.subprocess.Process) -> None:
    async with aiohttp.ClientSession() as http, asyncio.timeout(30):
        while True:
            assert proc.returncode is None, "the gateway exited"
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)


def _reload(pid: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The unit's ExecReload line, with systemd's $MAINPID."""
    line = _unit()["Service"]["ExecReload"]
    return subprocess.run(
        shlex.split(line), env={**env, "MAINPID": str(pid)}, capture_output=True, text=True
    )


@pytest.mark.parametrize("with_config", [False, True])
async def test_the_units_exec_lines_run_the_gateway_and_reload_it(
    tmp_path: Path, with_config: bool
) -> None:
    command = shlex.split(_unit()["Service"]["ExecStart"])
    assert command[0] == "/opt/streamer/bin/streamer"
    command[0] = str(Path(sys.executable).with_name("streamer"))  # this install's script
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    env.update(_env_file())
    port = free_port()
    env["STREAMER_PORT"] = str(port)
    if with_config:
        from scripted_backend import ScriptedBackend

        backend = ScriptedBackend()
        await backend.start()
        config = tmp_path / "streamer.toml"
        config.write_text(f'[[models]]\nname = "a"\nupstreams = ["{backend.base_url}"]\n')
        env["STREAMER_CONFIG"] = str(config)
    log = tmp_path / "gateway.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *command, env=env, stdout=err, stderr=err, cwd=tmp_path
        )
    try:
        await _healthy(f"http://127.0.0.1:{port}/healthz", proc)
        done = await asyncio.to_thread(_reload, proc.pid, env)
        assert done.returncode == 0, done.stderr
        if with_config:
            async with asyncio.timeout(30):
                while "config reloaded" not in log.read_text(errors="replace"):
                    await asyncio.sleep(0.05)
        else:
            assert "nothing to reload" in done.stdout
        await _healthy(f"http://127.0.0.1:{port}/healthz", proc)  # still serving
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if with_config:
            await backend.stop()
    assert re.search(r"streamer|serving", log.read_text(errors="replace"))
