#!/usr/bin/env bash
# Install the reference MCP server (npm `@modelcontextprotocol/server-everything`, pinned in
# tests/mcpnpm/package.json and its lock) into .tools/mcpnpm for tests/test_mcp.py.
# Idempotent and quiet; without npm it prints a note and exits 0 so that the test skips.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/tests/mcpnpm"
DIR="${MCPNPM_DIR:-$ROOT/.tools/mcpnpm}"
PKG="$DIR/node_modules/@modelcontextprotocol/server-everything/package.json"

if ! command -v npm >/dev/null 2>&1; then
    echo "install-mcp-everything: npm not found; its MCP test will be skipped" >&2
    exit 0
fi

mkdir -p "$DIR"
if cmp -s "$SRC/package-lock.json" "$DIR/package-lock.json" && [ -f "$PKG" ]; then
    exit 0
fi

cp "$SRC/package.json" "$SRC/package-lock.json" "$DIR/"
(cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)  # --prefix through a symlink fails
echo "install-mcp-everything: server-everything $(node -p "require('$PKG').version") in $DIR"
