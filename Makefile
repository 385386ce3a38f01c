# outbox-dispatcher developer targets. `make test` is the README's test command.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: services install lint test test-unit demo faults bench bench-peers soak e2e e2e-kind cluster-build images cluster cluster-down clean screenshots

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,demo]'
	touch $(STAMP)

# PostgreSQL, Redis and PgBouncer from Debian; PostgreSQL trusting loopback; both started on
# their usual ports (for the demo and benchmarks: the tests start their own servers).
services:
	bash tools/services.sh

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: $(STAMP) cluster-build images
	$(PY) -m pytest tests

# The unit tier: no root, no Go, no server of any kind (tests/unit is pure).
test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

# The console's screenshots in docs/images, taken by its browser tests (a test run alone
# saves them in a temporary folder).
screenshots: $(STAMP)
	CONSOLE_SCREENSHOTS=docs/images $(PY) -m pytest tests/browser

demo: $(STAMP)
	$(VENV)/bin/dispatcher demo

faults: $(STAMP)
	FAULTS_LONG=1 $(PY) -m pytest tests/faults -v

# End to end on the local cluster (no Docker needed): the images on a real node.
e2e: $(STAMP) cluster-build images
	$(PY) -m pytest tests/e2e -v -rs

# The chart on a kind cluster, where Docker is (needs docker, kind, helm, kubectl; skips with
# the reason otherwise). E2E_KEEP_CLUSTER=1 keeps the kind cluster.
e2e-kind: $(STAMP)
	$(PY) -m pytest tests/e2e/test_kind.py -m kind -v -rs

# The local cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the node's
# kubelet and kube-proxy, kubectl and helm built from Go modules (tools/k8s) into
# ~/.cache/outbox-dispatcher (a cold build takes many minutes); the node runs Debian's
# containerd and runc with the images of `make images`; state, logs and kubeconfig in .cluster/.
cluster-build:
	bash tools/cluster/build.sh

# The operator, enqueuer and worker images from the Dockerfile, and the node's pause image,
# built with buildah on a Debian base made here (no Docker, no registry; cached).
images:
	bash tools/images/build.sh

cluster: $(STAMP) cluster-build images
	$(PY) -m tools.cluster up

cluster-down: $(STAMP)
	$(PY) -m tools.cluster down

# The benchmark venv: the project plus procrastinate, the baseline of one figure (never a
# dependency of the project itself). BENCH_ARGS="--quick" or "--only idle_latency" for a part.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml benchmarks/requirements-bench.txt
	test -x $(BENCH_VENV)/bin/python || python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet -e . -r benchmarks/requirements-bench.txt
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m benchmarks.run $(BENCH_ARGS)

# Beside the peers (benchmarks/peers): River built from its Go module into a cache,
# procrastinate and Celery in venvs of their own under .venv-peers (never the project's); writes
# benchmarks/results/peers.json and peers.png. PEERS_ARGS="--quick" for a short run.
PEERS_VENVS := .venv-peers

$(PEERS_VENVS)/%/.installed: benchmarks/peers/requirements-%.txt
	test -x $(PEERS_VENVS)/$*/bin/python || python3 -m venv $(PEERS_VENVS)/$*
	$(PEERS_VENVS)/$*/bin/pip install --quiet -r $<
	touch $@

bench-peers: $(BENCH_STAMP) $(PEERS_VENVS)/procrastinate/.installed $(PEERS_VENVS)/celery/.installed
	bash benchmarks/peers/build_river.sh >/dev/null
	$(BENCH_VENV)/bin/python -m benchmarks.peers.run $(PEERS_ARGS)

soak: $(STAMP)
	$(PY) -m benchmarks.soak --minutes 30

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
