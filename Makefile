# Every target creates the venv if it is missing and installs the project into it.
# The install is editable in "compat" mode (a plain path in a .pth file), which type
# checkers read; setuptools' default editable finder hides the package from mypy.
#
# Every install takes its versions from $(CONSTRAINTS) (PIP_CONSTRAINT, so the build
# backend's own environment too): a fresh clone gets the tools and libraries the
# checkout was last tested with, not whatever was released since. `make upgrade-tools`
# moves the pins on purpose.
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev
CONSTRAINTS ?= constraints/dev.txt
BIN := $(VENV)/bin
# The suite runs on WORKERS pytest-xdist processes, a test file per worker at a time
# (its servers and clusters stay its own); 0 (the default) runs it in one process:
# on two workers a fresh-clone run had two timing tests fail under the doubled load.
WORKERS ?= 0
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadfile
STAMP := $(VENV)/.installed
PIN := PIP_CONSTRAINT=$(abspath $(CONSTRAINTS))

.PHONY: demo test test-fast lint typecheck typed-app docs cluster-demo bench protos clean \
	upgrade-tools test-redis-lowest wheel-check test-grpc-default

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing orleanspy[$(EXTRAS)] into $(VENV) (pins: $(CONSTRAINTS); log: $(VENV)/install.log)"
	@( $(PIN) $(BIN)/python -m pip install --upgrade pip && \
	   $(PIN) $(BIN)/python -m pip install --config-settings editable_mode=compat \
	       -e '.[$(EXTRAS)]' ) > $(VENV)/install.log 2>&1 \
	   || { tail -n 30 $(VENV)/install.log; exit 1; }
	touch $(STAMP)

# Re-resolve every dependency of .[dev] at its newest release, with the build tools,
# and write the pins. Run the whole suite before committing the new file.
upgrade-tools:
	rm -rf build/venv-upgrade
	$(PYTHON) -m venv build/venv-upgrade
	build/venv-upgrade/bin/python -m pip install -q --upgrade pip setuptools wheel
	build/venv-upgrade/bin/python -m pip install -q '.[dev]'
	{ sed -n '/^#/p' $(CONSTRAINTS); \
	  build/venv-upgrade/bin/python -m pip freeze --all --exclude orleanspy; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf build/venv-upgrade
	@git diff --stat -- $(CONSTRAINTS)

# The lowest redis-py the dependency range allows (the pins hold the highest): the
# type check and the Redis Cluster and Sentinel tests, in a venv of their own, in one
# process (their failovers are timed; on two workers one Sentinel run failed calls).
REDIS_LOWEST := $(shell sed -n 's/.*"redis\[hiredis\]>=\([0-9.]*\).*/\1/p' pyproject.toml)
LOWEST_VENV := build/venv-redis-$(REDIS_LOWEST)
build/constraints-redis-lowest.txt: $(CONSTRAINTS) pyproject.toml
	@test -n "$(REDIS_LOWEST)" || { echo "no redis lower bound in pyproject.toml" >&2; exit 1; }
	mkdir -p build
	sed 's/^redis==.*/redis==$(REDIS_LOWEST)/' $(CONSTRAINTS) > $@

test-redis-lowest: build/constraints-redis-lowest.txt
	$(MAKE) VENV=$(LOWEST_VENV) CONSTRAINTS=build/constraints-redis-lowest.txt typecheck
	$(LOWEST_VENV)/bin/python -c "import redis; print('redis-py', redis.__version__)"
	$(LOWEST_VENV)/bin/python -m pytest -q -p no:cacheprovider -n 0 $(REDIS_CLUSTER_TESTS) \
	    -k "cluster or sentinel or surface or reshard or failover"

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
	$(PYTEST)

# The tests that run on a Redis Cluster or behind Sentinels (test-redis-lowest: the
# contract suites' Redis Cluster and Sentinel cases, by name, and whole files).
REDIS_CLUSTER_TESTS := tests/test_redis_cluster.py tests/test_redis_py_surface.py \
	tests/cluster/test_redis_reshard.py tests/cluster/test_redis_failover.py \
	tests/cluster/test_failover_calls.py tests/test_redis_failover_retry.py \
	tests/reminders/test_reminder_tables.py tests/membership/test_tables.py \
	tests/storage/test_grain_storage.py tests/test_directory.py tests/test_streams.py

# The gRPC transport's tests and the cluster-call tests again on gRPC's default
# (EventEngine) client and listener. orleanspy sets GRPC_EXPERIMENTS to the classic TCP
# stack unless the environment sets it (docs/decisions.md, "gRPC runs on its classic
# TCP client and listener"); an empty value is set, so gRPC keeps its defaults, and a
# later grpcio without the classic stack is the stack these tests already pass on.
GRPC_DEFAULT_TESTS := tests/messaging/test_grpc_transport.py \
	tests/messaging/test_transport_contract.py tests/messaging/test_transport_kit.py \
	tests/cluster/test_cluster.py
test-grpc-default: $(STAMP)
	GRPC_EXPERIMENTS= $(BIN)/python -c "import os, orleanspy.messaging.grpc; \
	    assert os.environ['GRPC_EXPERIMENTS'] == '', os.environ['GRPC_EXPERIMENTS']"
	GRPC_EXPERIMENTS= $(PYTEST) $(GRPC_DEFAULT_TESTS)

# The tests that are not marked slow (no multi-process clusters).
test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

# The wheel and sdist, installed outside the checkout and smoke-tested (.ci/wheel).
wheel-check: $(STAMP)
	PYTHON=$(BIN)/python bash .ci/wheel

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir build/site

bench: $(STAMP)
	$(BIN)/python -m benchmarks

protos: $(STAMP)
	$(BIN)/python -m orleanspy.messaging.protogen

clean:
	rm -rf $(VENV) build *.egg-info
