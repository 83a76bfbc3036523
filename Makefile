# The two commands a newcomer needs: `make serve` and `make test`. Both bootstrap first
# (`serve` only its run-time part, see scripts/bootstrap.sh). `make test-fast` is the tier
# that needs no root (no namespaces, nftables or mounts), to run on every edit.
VENV := .venv/bin
PYTEST_ARGS ?=

.PHONY: bootstrap bootstrap-run serve test test-fast test-adversarial bench bench-smoke lint images cluster cluster-build cluster-down clean

# Everything: run time, test and benchmark tools, dev extras (scripts/bootstrap.sh test).
bootstrap:
	@bash scripts/bootstrap.sh test

# Only what the gateway needs at run time: no test tool, no service besides sandgate.
bootstrap-run:
	@bash scripts/bootstrap.sh run

serve: bootstrap-run
	$(VENV)/sandgate serve

test: bootstrap
	$(VENV)/pytest $(PYTEST_ARGS)

# Every test not marked `root` (tests/conftest.py skips those for non-root users anyway), each
# property with a fifth of its examples (tests/support/tiers.py); `make test` runs them all, one
# at a time (the root tests share one network namespace). The fast tier runs in FAST_WORKERS
# pytest-xdist workers, each test module whole on one worker so its module-scoped servers
# (execd, chromium) start once; docs/benchmarks.md has the measurements behind the default.
# The benchmarks' smoke runs (tests/bench, `make bench-smoke`) are left to `make test`.
# Bytecode caches (git-ignored __pycache__) are written even where the environment sets
# PYTHONDONTWRITEBYTECODE: without them every run compiles and assertion-rewrites every module
# in each worker and every execd or CLI subprocess, about 12 s of CPU per run. The schemathesis
# plugin serves only root tests (tests/conformance); not loading it saves each process 0.6 s.
FAST_WORKERS ?= 2
test-fast: bootstrap
	PYTHONDONTWRITEBYTECODE= SANDGATE_TEST_TIER=fast $(VENV)/pytest -m "not root" -p no:schemathesis \
	  --ignore=tests/bench -n $(FAST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# The whole adversarial suite (root) on one runtime and isolation: `make test-adversarial
# ISOLATION=gvisor`, `RUNTIME=docker` for the private dockerd (docs/runtime.md), `RUNTIME=kubernetes`
# for the test cluster with the node agent (docs/kubernetes.md; the cluster's build cached). `make test`
# runs it on local/standard, and tests/gvisor/adversarial's subset on gvisor.
ISOLATION ?= standard
RUNTIME ?= local
test-adversarial: bootstrap
	SANDGATE_TEST_ISOLATION=$(ISOLATION) SANDGATE_TEST_RUNTIME=$(RUNTIME) $(VENV)/pytest tests/adversarial $(PYTEST_ARGS)

# Every benchmark, long and bounded, for a quiet machine (docs/benchmarks.md).
bench: bootstrap
	$(VENV)/python -m bench

# Every benchmark in its smallest bounded mode, each checked for every row and ratio it promises
# (tests/bench/test_smoke.py): that they work, not how fast. `make test` (CI) runs it too.
bench-smoke: bootstrap
	$(VENV)/pytest tests/bench -p no:cacheprovider --durations=0 $(PYTEST_ARGS)

# Sandbox images for the Docker runtime, from local files only (see docs/docker.md): built into
# the daemon at DOCKER_HOST / the system socket, else in a private dockerd and saved for `docker load`.
images: bootstrap
	$(VENV)/python sandbox-images/build.py

# A one-node Kubernetes cluster on this machine (root), built once per version from Go modules
# into ~/.cache/sandgate/k8s, started in a network namespace of its own; prints the kubeconfig.
# `make cluster-down` removes all of it (docs/kubernetes.md).
cluster:
	@bash scripts/bootstrap.sh cluster
	@PYTHON=$(VENV)/python bash scripts/cluster/up.sh
	@PYTHON=$(VENV)/python bash scripts/cluster/execd-image.sh

cluster-build:
	@bash scripts/cluster/build.sh

cluster-down:
	@bash scripts/cluster/down.sh

lint: bootstrap
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	@mkdir -p .typeroot/sandgate && for c in policy vault proxy lifecycle execd; do ln -sfn ../../$$c .typeroot/sandgate/$$c; done
	$(VENV)/mypy
	$(VENV)/lint-imports
	@# every example policy and preset, as CI would check an operator's presets and their users
	$(VENV)/sandgate policy check --preset-dir examples/presets $$(find examples -name '*.yaml' | sort)

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache .typeroot
