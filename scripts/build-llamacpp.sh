#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (from the llama-cpp-python sdist on PyPI, which bundles it)
# into .tools/llamacpp/, and make a tiny random-weight GGUF model for the real-backend tests
# (tests/backends/). Idempotent: skips what is already there. On any failure it prints why and
# exits 0, so the tests skip with that reason instead of failing.
set -uo pipefail

LLAMACPP_PY_VERSION="${LLAMACPP_PY_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${LLAMACPP_DIR:-$ROOT/.tools/llamacpp}"
BIN="$DIR/bin/llama-server"
MODEL="$DIR/tiny.gguf"
PY="${PYTHON:-python3}"
JOBS="${LLAMACPP_JOBS:-2}"

fail() {
    echo "build-llamacpp: FAILED: $*; the real-backend tests will be skipped" >&2
    mkdir -p "$DIR" && echo "$*" >"$DIR/FAILED"
    exit 0
}

mkdir -p "$DIR"
rm -f "$DIR/FAILED"
SRC="$DIR/src/llama_cpp_python-$LLAMACPP_PY_VERSION/vendor/llama.cpp"

if [ ! -d "$SRC" ]; then
    command -v "$PY" >/dev/null || fail "no $PY"
    rm -rf "$DIR/src" && mkdir -p "$DIR/src"
    "$PY" -m pip download -q --no-binary :all: --no-deps -d "$DIR/src" \
        "llama-cpp-python==$LLAMACPP_PY_VERSION" || fail "pip download of llama-cpp-python failed"
    tar -xzf "$DIR/src"/llama_cpp_python-*.tar.gz -C "$DIR/src" 2>/dev/null \
        || tar -xzf "$DIR/src"/llama-cpp-python-*.tar.gz -C "$DIR/src" \
        || fail "could not unpack the sdist"
    [ -d "$SRC" ] || SRC="$(ls -d "$DIR"/src/*/vendor/llama.cpp 2>/dev/null | head -1)"
    [ -d "$SRC" ] || fail "the sdist has no vendor/llama.cpp"
fi
[ -d "$SRC" ] || SRC="$(ls -d "$DIR"/src/*/vendor/llama.cpp 2>/dev/null | head -1)"

if [ ! -x "$BIN" ]; then
    command -v cmake >/dev/null || fail "cmake not found (apt-get install cmake)"
    command -v c++ >/dev/null || fail "no C++ compiler (apt-get install g++)"
    echo "build-llamacpp: building llama-server (a few minutes on $JOBS cores)" >&2
    cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=ON -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF >"$DIR/cmake.log" 2>&1 \
        || fail "cmake configure failed (see $DIR/cmake.log)"
    cmake --build "$DIR/build" --target llama-server -j"$JOBS" >>"$DIR/cmake.log" 2>&1 \
        || fail "cmake build failed (see $DIR/cmake.log)"
    mkdir -p "$DIR/bin"
    cp "$DIR/build/bin/llama-server" "$BIN" || fail "no llama-server in the build"
fi

if [ ! -f "$MODEL" ]; then
    VENV="$DIR/venv"
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -m venv "$VENV" || fail "could not make a venv for gguf"
    fi
    "$VENV/bin/python" -c "import gguf, numpy" 2>/dev/null \
        || "$VENV/bin/pip" install -q gguf numpy || fail "pip install gguf failed"
    "$VENV/bin/python" "$ROOT/scripts/make_tiny_model.py" --src "$SRC" --out "$MODEL.tmp" \
        || fail "making the tiny model failed"
    mv "$MODEL.tmp" "$MODEL"
fi
echo "build-llamacpp: $BIN and $MODEL ready"
