# Alnair: the two commands are `make demo` and `make test`; each installs what it needs.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PY ?= python3
UV := $(PY) -m uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup setup-python setup-native setup-control-plane setup-node setup-peers setup-browser test test-unit test-integration test-e2e \
        lint fmt demo up down status dev-up dev-down bench bench-placement bench-scheduler bench-predictor bench-queue bench-dispatcher bench-console bench-multicluster bench-colocation bench-elastic bench-elastic-flap chaos soak schema sbom clean

setup: setup-python setup-native setup-control-plane setup-node setup-peers setup-browser ## install everything the tests and the demo need

# uv, quietly: a Debian Python refuses a plain `pip install` (PEP 668, "externally-managed-
# environment"), which is not an error worth a new user's first screen; the user install is
# the fallback, and only its failure is shown.
setup-python:
	@$(UV) --version >/dev/null 2>&1 \
	  || $(PY) -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 \
	  || $(PY) -m pip install --quiet --disable-pip-version-check --user --break-system-packages uv
	@# Bytecode compiled once, as the images do (UV_COMPILE_BYTECODE): every service process the
	@# tests, benchmarks and demo start would otherwise compile ~1,900 modules (2-3 s) first.
	@$(UV) sync --all-packages --quiet --compile-bytecode
	@$(BIN)/python -m compileall -q -j 0 libs/*/src services/*/src >/dev/null
	@$(BIN)/python -m alnair.deviceplugin.protos >/dev/null 2>&1 || true

setup-native:
	@$(MAKE) -s -C native/intercept all

setup-control-plane:
	@bash hack/build-control-plane.sh all

# One real node beside the KWOK ones: the kubelet, containerd 2.x, the CNI plugins and a static
# pause, built from their Go modules and cached; runc from Debian (`make up WITH=realnode`).
setup-node: setup-control-plane
	@bash hack/build-node.sh all

# A real browser for the console's tests (Debian's chromium; the tests speak its DevTools
# protocol directly, so no driver has to match its version).
setup-browser:
	@bash hack/setup-browser.sh

# Other projects' parts the e2e tests meet (JobSet's CRDs and controller), from their Go modules.
setup-peers:
	@bash hack/build-peers.sh

test: setup ## the whole suite: unit, integration (real nats/redis), e2e (real control plane)
	@$(BIN)/pytest tests -p no:cacheprovider
	@$(MAKE) -s -C native/intercept test

test-unit: setup-python
	@$(BIN)/pytest tests/unit -p no:cacheprovider

test-integration: setup-python
	@$(BIN)/pytest tests/integration -p no:cacheprovider

test-e2e: setup
	@$(BIN)/pytest tests/e2e -p no:cacheprovider

lint: setup-python
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .
	@$(BIN)/mypy libs/common/src libs/dev/src services/*/src
	@$(BIN)/lint-imports

sbom: setup-python ## each image's software bill of materials (CycloneDX, build/sbom/), checked against uv.lock
	@UV="$(UV)" bash hack/sbom.sh

fmt: setup-python
	@$(BIN)/ruff format .
	@$(BIN)/ruff check --fix .

schema: setup-python ## JSON Schema of every event, for external subscribers
	@$(BIN)/python -m alnair.common.events schema --out $(or $(SCHEMA_OUT),deploy/schemas)

# The replay needs no Kubernetes and comes first; the live part (ALNAIR_DEMO_LIVE=0 skips it) runs
# the whole system on 200 KWOK GPU nodes with Gavel's Philly trace, time-compressed.
demo: setup-python setup-control-plane setup-browser ## replay the Alibaba GPU trace under every policy, then the whole system live
	@$(BIN)/python -m alnair.scheduler.simulator.demo $(DEMO_ARGS)
	@$(BIN)/python -m alnair.dev.live_demo $(LIVE_DEMO_ARGS)

# The whole system as local processes: infrastructure, KWOK GPU nodes and every service, each on
# its own port, logs in .dev/logs (ALNAIR_DEV_DIR moves the folder). NODES="50x V100M32, 8x T4:4"
# changes the nodes, FREE_PORTS=1 picks free ports, WITH=deviceplugin adds optional services.
up: setup-python setup-control-plane $(if $(findstring realnode,$(WITH)),setup-node) ## start everything in the background and say where each API is
	@$(BIN)/python -m alnair.dev.devstack up $(if $(NODES),--nodes "$(NODES)") \
	  $(if $(FREE_PORTS),--free-ports) $(if $(WITH),--with "$(WITH)") \
	  $(if $(TOPOLOGY),--topology "$(TOPOLOGY)")

down: ## stop everything `make up` started
	@$(BIN)/python -m alnair.dev.devstack down

status: ## what is up: each process alive, each service's /readyz
	@$(BIN)/python -m alnair.dev.devstack status

dev-up: up
dev-down: down

bench: bench-placement

bench-placement: setup-python ## per-policy speed on one trace; PLACEMENT_ARGS=--table: alnair vs FGD on the shipped and built trace variants, seeds 42-51 (JSON)
	@$(BIN)/python bench/placement.py $(PLACEMENT_ARGS)

bench-scheduler: setup ## Alnair vs kube-scheduler as scheduler_perf measures, 7 workloads (JSON; SCHEDULER_BENCH_ARGS)
	@bash hack/build-coscheduling.sh || echo "coscheduling kube-scheduler not built: gang runs against plain kube-scheduler" >&2
	@$(BIN)/python bench/scheduler.py $(SCHEDULER_BENCH_ARGS)

bench-predictor: setup-python ## where the predictor's held-out error comes from (JSON)
	@$(BIN)/python bench/predictor_error_split.py $(PREDICTOR_BENCH_ARGS)

bench-queue: setup-python ## queueing policies over Gavel's Philly arrivals, beside Gavel's own figures (JSON; QUEUE_BENCH_ARGS=--limit N: a smoke run)
	@$(BIN)/python bench/job_queue.py $(QUEUE_BENCH_ARGS)

bench-colocation: setup-python ## interference-aware sharing vs FGD, binpack, alnair, random over time on Gavel's pairs (JSON; COLOCATION_BENCH_ARGS)
	@$(BIN)/python bench/colocation.py $(COLOCATION_BENCH_ARGS)

bench-dispatcher: setup-python setup-control-plane ## the dispatcher beside Kueue on Kueue's scheduler performance test, baseline config (JSON; DISPATCHER_BENCH_ARGS)
	@bash hack/build-peers.sh
	@$(BIN)/python bench/dispatcher.py $(DISPATCHER_BENCH_ARGS)

bench-console: setup-python setup-control-plane ## the console's endpoints, 20 clients at 5,000 nodes and 10,000 queued jobs, p50/p99 (JSON; CONSOLE_BENCH_ARGS)
	@$(BIN)/python bench/console.py $(CONSOLE_BENCH_ARGS)

bench-multicluster: setup-python ## one queue over three clusters: alnair vs round-robin, least-loaded, first-fit (JSON)
	@$(BIN)/python bench/multicluster.py $(MULTICLUSTER_BENCH_ARGS)

bench-elastic: setup ## ElasticJob grow/shrink latency, p50/p99 (JSON)
	@$(BIN)/python bench/elastic.py $(ELASTIC_BENCH_ARGS)

bench-elastic-flap: setup ## anti-flap: GPUs freed and reclaimed every 20 s for 5 minutes (JSON)
	@$(BIN)/python bench/elastic.py --flap $(or $(FLAP_BENCH_ARGS),--duration-s 300 --period-s 20 --cooldown-s 60)

chaos: setup ## kill -9 every service 20x, restart nats and the API server, during 1,000 jobs; invariants (JSON)
	@$(BIN)/python bench/chaos.py $(CHAOS_ARGS)

soak: setup ## 30 minutes of job churn on 1,000 KWOK nodes: RSS per service and queue depths (JSON)
	@$(BIN)/python bench/soak.py $(SOAK_ARGS)

clean:
	@$(MAKE) -s -C native/intercept clean || true
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
