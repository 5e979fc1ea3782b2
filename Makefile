# Every target creates the venv if it is missing and installs the project into it.
# The install is editable in "compat" mode (a plain path in a .pth file), which type
# checkers read; setuptools' default editable finder hides the package from mypy.
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint typecheck typed-app docs cluster-demo bench protos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing orleanspy[$(EXTRAS)] into $(VENV) (log: $(VENV)/install.log)"
	@( $(BIN)/python -m pip install --upgrade pip && \
	   $(BIN)/python -m pip install --config-settings editable_mode=compat \
	       -e '.[$(EXTRAS)]' ) > $(VENV)/install.log 2>&1 \
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

# An application type-checked against the installed package, as a team would (PEP 561);
# bad.py must fail, which shows the check sees real types and not Any.
typed-app: $(STAMP)
	cd .ci/typed_app && ../../$(BIN)/mypy --strict app.py
	cd .ci/typed_app && ! ../../$(BIN)/mypy --strict bad.py > /dev/null

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider

# The tests that are not marked slow (no multi-process clusters).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow"

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir build/site

bench: $(STAMP)
	$(BIN)/python -m benchmarks

protos: $(STAMP)
	$(BIN)/python -m orleanspy.messaging.protogen

clean:
	rm -rf $(VENV) build *.egg-info
