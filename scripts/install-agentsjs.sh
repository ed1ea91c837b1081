#!/usr/bin/env bash
# Install the OpenAI Agents SDK for JavaScript (npm `@openai/agents`, versions pinned in
# tests/agentsjs/package.json and its lock) into .tools/agentsjs for
# tests/test_client_agentsjs.py. Idempotent and quiet; without npm it prints a note and exits
# 0 so that the tests skip.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/tests/agentsjs"
AGENTSJS_DIR="${AGENTSJS_DIR:-$ROOT/.tools/agentsjs}"

if ! command -v npm >/dev/null 2>&1; then
    echo "install-agentsjs: npm not found; the Agents SDK for JavaScript tests will be skipped" >&2
    exit 0
fi

mkdir -p "$AGENTSJS_DIR"
# Up to date when the installed lock is the pinned one and the package is there.
if cmp -s "$SRC/package-lock.json" "$AGENTSJS_DIR/package-lock.json" \
    && [ -f "$AGENTSJS_DIR/node_modules/@openai/agents/package.json" ]; then
    exit 0
fi

cp "$SRC/package.json" "$SRC/package-lock.json" "$AGENTSJS_DIR/"
(cd "$AGENTSJS_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
echo "install-agentsjs: @openai/agents" \
    "$(node -p "require('$AGENTSJS_DIR/node_modules/@openai/agents/package.json').version")" \
    "in $AGENTSJS_DIR"
