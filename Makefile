# Every target creates .venv if it is missing and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck cluster-demo bench protos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing orleanspy and its test tools into $(VENV) (log: $(VENV)/install.log)"
	@( $(BIN)/python -m pip install --upgrade pip && \
	   $(BIN)/python -m pip install -e '.[dev]' ) > $(VENV)/install.log 2>&1 \
	   || { tail -n 30 $(VENV)/install.log; exit 1; }
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m samples.demo

cluster-demo: $(STAMP)
	$(BIN)/python -m samples.cluster_demo

lint: $(STAMP)
	$(BIN)/ruff check orleanspy tests benchmarks samples
	$(BIN)/ruff format --check orleanspy tests benchmarks samples

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python -m benchmarks

protos: $(STAMP)
	$(BIN)/python -m orleanspy.messaging.protogen

clean:
	rm -rf $(VENV) build *.egg-info
