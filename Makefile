# pygazette developer entry points. `make test` works on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PORT ?= 8080
DATA ?= ./data
PROTOS := pygazette/protocol/pb/protocol.proto

.PHONY: all venv deps serve test test-faults unit lint proto bench bench-cluster clean

all: test

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# System dependencies that the integration tests run for real.
deps: venv
	@./.ci/install-system-deps

serve: venv
	$(VENV)/bin/pygazette serve --port $(PORT) --data-dir $(DATA)

proto: venv
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)

lint: venv
	$(VENV)/bin/ruff check pygazette tests bench
	$(VENV)/bin/mypy pygazette

test: deps lint
	$(VENV)/bin/pytest -q

# The long version of the cluster fault tests (kills, restarts, freezes, scaling; many
# rounds of each). `make test` runs one round of each.
FAULT_ROUNDS ?= 10
test-faults: deps
	PYGAZETTE_FAULT_ROUNDS=$(FAULT_ROUNDS) $(VENV)/bin/pytest -q \
		tests/broker/test_cluster_faults.py --timeout=3600

bench: venv
	$(PY) bench/append_read.py

bench-cluster: deps
	$(PY) bench/cluster.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
