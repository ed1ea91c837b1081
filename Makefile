# streamer: two commands on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: lock run test test-backends compliance llamacpp lint format install codex aisdk agentsjs redis haproxy bench bench-quick bench-history soak fuzz clean

$(STAMP): pyproject.toml requirements.lock
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements.lock -e '.[test,otel]'
	touch $(STAMP)

install: $(STAMP)

## Run the gateway on the embedded scripted model (or UPSTREAM=http://host:port/v1).
run: $(STAMP)
	$(BIN)/python -m streamer serve --host $(HOST) --port $(PORT) $(if $(UPSTREAM),--upstream $(UPSTREAM))

## Set up and run the whole test suite (JOBS processes; the tests wait more than they compute).
JOBS ?= 2
test: $(STAMP)
	$(BIN)/pytest -q -n $(JOBS)

## Only the real-backend tests (tests/backends/, a real llama.cpp; they skip without its build).
test-backends: $(STAMP)
	$(BIN)/pytest -q -m backends tests/backends

## The Open Responses compliance tests and the spec checks alone (`make test` runs them too).
compliance: $(STAMP)
	$(BIN)/pytest -q tests/test_openresponses_compliance.py tests/test_conformance.py

lint: $(STAMP)
	$(BIN)/ruff check streamer tests bench
	$(BIN)/ruff format --check streamer tests bench
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix streamer tests bench
	$(BIN)/ruff format streamer tests bench

## Optional real clients and servers used by some tests (tests skip without them).
codex:
	bash scripts/install-codex.sh

aisdk:
	bash scripts/install-aisdk.sh

agentsjs:
	bash scripts/install-agentsjs.sh

llamacpp:
	bash scripts/build-llamacpp.sh

redis:
	command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server)

haproxy:
	command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || (apt-get update -qq && apt-get install -y -qq haproxy)

## The benchmark suite: the gateway against the raw relay and the peers (bench/README.md).
bench: $(STAMP)
	bash scripts/install-peers.sh
	$(BIN)/python bench/run.py $(BENCH_ARGS)

bench-quick: $(STAMP)
	bash scripts/install-peers.sh
	$(BIN)/python bench/run.py --quick $(BENCH_ARGS)

## CPU per turn against the conversation's length (issue 31), with the peers, in one run;
## prints the ratios to the targets (bench/README.md, docs/benchmarks.md).
bench-history: $(STAMP)
	bash scripts/install-peers.sh
	$(BIN)/python bench/bench_history.py $(BENCH_ARGS)

## Long variants of the fault/load tests and of the property-based fuzzing.
soak: $(STAMP)
	$(BIN)/pytest -q -m slow -k "soak or load" tests

fuzz: $(STAMP)
	STREAMER_FUZZ_EXAMPLES=$${STREAMER_FUZZ_EXAMPLES:-5000} $(BIN)/pytest -q -m slow -k fuzz tests

## Regenerate requirements.lock after a dependency change in pyproject.toml.
lock:
	bash scripts/lock.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
