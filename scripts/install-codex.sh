#!/usr/bin/env bash
# Install the Codex CLI (a real Responses client) into .tools/codex for the codex tests.
# Idempotent and quiet; without npm it prints a note and exits 0 so that the tests skip.
set -euo pipefail

CODEX_VERSION="${CODEX_VERSION:-0.169.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CODEX_DIR="${CODEX_DIR:-$ROOT/.tools/codex}"
BIN="$CODEX_DIR/node_modules/.bin/codex"

if ! command -v npm >/dev/null 2>&1; then
    echo "install-codex: npm not found; the Codex CLI tests will be skipped" >&2
    exit 0
fi

if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "$CODEX_VERSION"; then
    exit 0
fi

mkdir -p "$CODEX_DIR"
npm install --prefix "$CODEX_DIR" --no-audit --no-fund --loglevel=error \
    "@openai/codex@$CODEX_VERSION" >/dev/null
"$BIN" --version >/dev/null
echo "install-codex: $("$BIN" --version) in $CODEX_DIR"
