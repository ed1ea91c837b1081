#!/usr/bin/env bash
# Install the Vercel AI SDK (npm `ai` + `@ai-sdk/openai`, versions pinned in
# tests/aisdk/package.json and its lock) into .tools/aisdk for tests/test_client_aisdk.py.
# Idempotent and quiet; without npm it prints a note and exits 0 so that the tests skip.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/tests/aisdk"
AISDK_DIR="${AISDK_DIR:-$ROOT/.tools/aisdk}"

if ! command -v npm >/dev/null 2>&1; then
    echo "install-aisdk: npm not found; the Vercel AI SDK tests will be skipped" >&2
    exit 0
fi

mkdir -p "$AISDK_DIR"
# Up to date when the installed lock is the pinned one and the packages are there.
if cmp -s "$SRC/package-lock.json" "$AISDK_DIR/package-lock.json" \
    && [ -f "$AISDK_DIR/node_modules/ai/package.json" ] \
    && [ -f "$AISDK_DIR/node_modules/@ai-sdk/openai/package.json" ]; then
    exit 0
fi

cp "$SRC/package.json" "$SRC/package-lock.json" "$AISDK_DIR/"
npm ci --prefix "$AISDK_DIR" --no-audit --no-fund --loglevel=error >/dev/null
echo "install-aisdk: ai $(node -p "require('$AISDK_DIR/node_modules/ai/package.json').version")," \
    "@ai-sdk/openai $(node -p "require('$AISDK_DIR/node_modules/@ai-sdk/openai/package.json').version")" \
    "in $AISDK_DIR"
