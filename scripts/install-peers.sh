#!/usr/bin/env bash
# Install the benchmark's own tools, each in its own venv under .tools/ (never a dependency
# of the project): the peer gateways (the LiteLLM proxy, vLLM's agentic-api, codex-relay,
# ds4codex, agent-wire-proxy), matplotlib (for the plot) and py-spy.
# Idempotent; a failed install prints a note and exits 0, so that `make bench` reports the
# peer as skipped instead of failing.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# Pinned: 1.106.12's [proxy] extra resolves from the registry (newer releases pin
# litellm-proxy / litellm-proxy-extras builds it lacks), and it predates the compromised
# 1.107.0 release.
LITELLM_VERSION="${LITELLM_VERSION:-1.106.12}"
# vLLM's Rust Responses gateway (a prebuilt binary inside the wheel; no vLLM without [local]).
AGENTIC_API_VERSION="${AGENTIC_API_VERSION:-0.9.0}"
# Responses-to-Chat bridges: codex-relay (a Rust binary in the wheel), ds4codex and
# agent-wire-proxy (Python).
CODEX_RELAY_VERSION="${CODEX_RELAY_VERSION:-0.5.8}"
DS4CODEX_VERSION="${DS4CODEX_VERSION:-0.1.6}"
AGENT_WIRE_PROXY_VERSION="${AGENT_WIRE_PROXY_VERSION:-0.2.0}"
MATPLOTLIB_SPEC="${MATPLOTLIB_SPEC:-matplotlib>=3.7}"
PEERS_DIR="${PEERS_DIR:-$ROOT/.tools/peers}"
BENCH_VENV="${BENCH_VENV:-$ROOT/.tools/bench-venv}"

note() { echo "install-peers: $*" >&2; }

# make_venv DIR CHECK SPEC...: create DIR, install SPEC unless `DIR/bin/python -c CHECK` passes.
# Whatever goes wrong ends up in DIR.install.log (pip's output, or a line saying what failed):
# the bench reports a peer it cannot find with that log's last error lines.
make_venv() {
    local dir="$1" check="$2" log="$1.install.log"
    shift 2
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
        return 0
    fi
    mkdir -p "$(dirname "$dir")"
    if ! "$PYTHON" -m venv "$dir" >"$log" 2>&1; then
        echo "ERROR: $PYTHON -m venv $dir failed" >>"$log"
        note "cannot create a venv at $dir (python3 -m venv failed; see $log)"
        return 1
    fi
    "$dir/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    if ! "$dir/bin/python" -m pip install --quiet "$@" >"$log" 2>&1; then
        note "pip install $* failed; see $log"
        return 1
    fi
    if ! "$dir/bin/python" -c "$check" >>"$log" 2>&1; then
        echo "ERROR: installed, but the check failed: $check" >>"$log"
        note "$* installed, but its check failed; see $log"
        return 1
    fi
}

want="${1:-all}"

if [ "$want" = all ] || [ "$want" = plot ]; then
    if make_venv "$BENCH_VENV" "import matplotlib" "$MATPLOTLIB_SPEC"; then
        note "matplotlib ready in $BENCH_VENV"
        # py-spy, to profile the gateway under load; optional
        [ -x "$BENCH_VENV/bin/py-spy" ] || "$BENCH_VENV/bin/python" -m pip install --quiet py-spy \
            >>"$BENCH_VENV.install.log" 2>&1 || note "py-spy unavailable (optional)"
    else
        note "matplotlib unavailable: the benchmark will skip its plot"
    fi
fi

if [ "$want" = all ] || [ "$want" = litellm ]; then
    LITELLM_DIR="$PEERS_DIR/litellm"
    check="import importlib.metadata as m; assert m.version('litellm') == '$LITELLM_VERSION'"
    if make_venv "$LITELLM_DIR" "$check" "litellm[proxy]==$LITELLM_VERSION"; then
        [ -x "$LITELLM_DIR/bin/litellm" ] && note "LiteLLM $LITELLM_VERSION ready in $LITELLM_DIR"
    else
        note "LiteLLM unavailable: the benchmark will report it as skipped"
    fi
fi
if [ "$want" = all ] || [ "$want" = agentic-api ]; then
    AGENTIC_DIR="$PEERS_DIR/agentic-api"
    check="import importlib.metadata as m; assert m.version('agentic-api') == '$AGENTIC_API_VERSION'"
    if make_venv "$AGENTIC_DIR" "$check" "agentic-api==$AGENTIC_API_VERSION"; then
        [ -x "$AGENTIC_DIR/bin/agentic-server" ] && note "agentic-api $AGENTIC_API_VERSION ready in $AGENTIC_DIR"
    else
        note "agentic-api unavailable: the benchmark will report it as skipped (see $AGENTIC_DIR.install.log)"
    fi
fi

# install_peer NAME DIST VERSION: a pinned peer in $PEERS_DIR/NAME. On failure the installer's
# output stays in $PEERS_DIR/NAME.install.log, whose tail the bench puts in its report.
install_peer() {
    local name="$1" dist="$2" version="$3" dir="$PEERS_DIR/$1"
    local check="import importlib.metadata as m; assert m.version('$dist') == '$version'"
    if make_venv "$dir" "$check" "$dist==$version"; then
        note "$name $version ready in $dir"
    else
        note "$name unavailable: the benchmark will report it as skipped (see $dir.install.log)"
    fi
}
for peer in "codex-relay codex-relay $CODEX_RELAY_VERSION" "ds4codex ds4codex $DS4CODEX_VERSION" \
    "agent-wire-proxy agent-wire-proxy $AGENT_WIRE_PROXY_VERSION"; do
    read -r name dist version <<<"$peer"
    if [ "$want" = all ] || [ "$want" = "$name" ]; then
        install_peer "$name" "$dist" "$version"
    fi
done
exit 0
