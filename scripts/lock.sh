#!/usr/bin/env bash
# Regenerate requirements.lock: every run and test dependency of the project (all its extras),
# pinned as a fresh venv resolves them from PyPI today. `make install` installs under these
# pins (pip -c), so every machine gets the same versions; run this after changing a
# dependency in pyproject.toml (tests/test_packaging.py fails until the lock names it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
EXTRAS="$("$PY" -c 'import tomllib,sys; print(",".join(sorted(tomllib.load(open(sys.argv[1],"rb"))["project"]["optional-dependencies"])))' "$ROOT/pyproject.toml")"
"$PY" -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install -q --upgrade pip
"$TMP/venv/bin/pip" install -q "$ROOT[$EXTRAS]"
{
    echo "# Pinned run and test dependencies of streamer-gateway (extras: $EXTRAS), for Python"
    echo "# $("$PY" -c 'import sys; print(".".join(map(str, sys.version_info[:2])))') on $(uname -s) $(uname -m). Regenerate with scripts/lock.sh; used as pip constraints by"
    echo "# \`make install\` and deploy/Dockerfile (pip install -c requirements.lock ...)."
    "$TMP/venv/bin/pip" freeze --exclude streamer-gateway
} >"$ROOT/requirements.lock"
echo "lock: $(grep -vc '^#' "$ROOT/requirements.lock") pins in requirements.lock"
