# Phalanx: `make demo` and `make test` are the two set-up commands; the rest are quicker targets.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST := $(BIN)/pytest
STAMP := $(VENV)/.installed
# `make test` and `make test-integration` run on PYTEST_WORKERS pytest-xdist workers, each with its
# own cluster and operator; tests/conftest.py keeps the torch-heavy tests on one worker and each file
# on one worker. PYTEST_WORKERS=0 runs in one process. PYTEST_ARGS: extra arguments (--durations=30).
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadscope)

.PHONY: help system-deps venv cluster-bin kueue-bin lint typecheck test test-unit test-integration test-e2e test-trainer \
        crd crd-check docs chart-lint kind-up demo bench bench-trainer bench-restart bench-restore bench-checkpoint bench-gang bench-decision bench-pass-reads bench-footprint-ab bench-contention-ab bench-kueue bench-recovery bench-node-loss bench-goodput bench-failover gpu-check dev-up dev-down clean

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): requirements-dev.txt operator/pyproject.toml trainer-image/pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -e operator -e trainer-image
	@touch $@

system-deps: ## check (as root: install) the system packages the development node needs
	bash hack/system-deps.sh

venv: $(STAMP) ## create the development virtualenv (.venv) with pinned dependencies

cluster-bin: ## build (or reuse from ~/.cache/phalanx) etcd, kube-*, kubectl, kwok, helm
	bash hack/cluster-bin.sh

kueue-bin: ## build (or reuse from ~/.cache/phalanx) Kueue's manager, CRDs and webhook manifests
	bash hack/kueue-bin.sh

lint: $(STAMP) ## ruff and the import layering (.importlinter)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/ruff format --check operator trainer-image tests bench hack

typecheck: $(STAMP) ## mypy --strict on the product code
	$(BIN)/mypy

crd: $(STAMP) ## regenerate crds/ and docs/api.md from the typed models
	$(BIN)/python -m phalanx.api.generate --write

crd-check: $(STAMP) ## fail when the committed CRD, chart copy or API docs are stale
	$(BIN)/python -m phalanx.api.generate --check

test-unit: $(STAMP) ## unit tests only (no cluster, no torch processes): seconds
	$(PYTEST) -m unit -q

test-trainer: $(STAMP) ## trainer tests (torch.distributed on CPU with gloo)
	$(PYTEST) -m trainer -q

test-integration: system-deps $(STAMP) cluster-bin kueue-bin ## integration tests against the local control plane
	$(PYTEST) -m integration -q $(XDIST) $(PYTEST_ARGS)

test-e2e: system-deps $(STAMP) cluster-bin ## end-to-end: real training through the operator
	$(PYTEST) -m e2e -q

test: system-deps $(STAMP) cluster-bin kueue-bin lint typecheck crd-check ## the whole suite: lint, types, CRD freshness, all tests
	$(PYTEST) -q $(XDIST) $(PYTEST_ARGS)

chart-lint: cluster-bin ## helm lint --strict the chart
	"$$(bash hack/cluster-bin.sh --print-dir)/helm" lint --strict charts/phalanx --kube-version 1.36.3

kind-up: ## with Docker: a kind cluster, both images, the chart and an example job
	bash hack/kind-up.sh

dev-up: $(STAMP) cluster-bin ## start the local cluster in the background
	$(BIN)/phalanx dev up

dev-down: $(STAMP) ## stop the local cluster
	$(BIN)/phalanx dev down

demo: system-deps $(STAMP) cluster-bin ## the main job on a local cluster: train, preempt, recover
	$(BIN)/python -m phalanx.demo

bench: bench-trainer bench-checkpoint bench-gang bench-recovery bench-failover ## all benchmarks (results in bench/results/)

bench-checkpoint: $(STAMP)
	$(BIN)/python -m phalanx_trainer.checkpoint.bench

bench-restore: $(STAMP) ## a worker's build + checkpoint restore, imported heap frozen vs not -> bench/results/restore.json
	$(BIN)/python bench/restore_bench.py

bench-restart: $(STAMP) ## restart in place: state kept in memory vs restored from storage -> bench/results/restart_memory.json
	PYTHONPATH=trainer-image $(BIN)/python -m phalanx_trainer.restart_bench --compare memory --pairs 7 --out bench/results/restart_memory.json

bench-trainer: $(STAMP)
	$(BIN)/python bench/trainer_bench.py

gpu-check: $(STAMP) ## on a GPU machine: NCCL all-reduce busbw, bf16 FSDP run of gpt-125m-gpu.toml, MFU -> bench/results/gpu.json
	$(BIN)/python bench/gpu_check.py

bench-gang: $(STAMP) cluster-bin ## admission cost, contention, footprint, then the steady state (PHALANX_BENCH_STEADY_SECONDS: a shorter window)
	$(BIN)/python bench/gang_bench.py
	$(BIN)/python bench/steady_state.py

bench-footprint-ab: $(STAMP) cluster-bin ## the footprint part, this tree's operator vs BASELINE=<commit>'s, 5 interleaved pairs -> bench/results/footprint-ab.json
	$(BIN)/python bench/part_ab.py --part footprint --baseline $(or $(BASELINE),$(error give BASELINE=<commit>)) --pairs 5

bench-contention-ab: $(STAMP) cluster-bin ## the contention part, this tree's operator vs BASELINE=<commit>'s, 5 interleaved pairs -> bench/results/contention-ab.json
	$(BIN)/python bench/part_ab.py --part contention --baseline $(or $(BASELINE),$(error give BASELINE=<commit>)) --pairs 5

bench-decision: $(STAMP) ## one admission decision on 500 nodes, the nodes re-read per decision vs one shared NodeSet, 7 pairs -> bench/results/decision.json
	$(BIN)/python bench/decision_bench.py

bench-pass-reads: $(STAMP) ## when nodes free, as a pass reads it on 5,000 nodes x 8 pods, this tree vs BASELINE=<commit>, 5 pairs -> bench/results/pass-reads.json
	$(BIN)/python bench/pass_reads_bench.py --baseline $(or $(BASELINE),$(error give BASELINE=<commit>)) --pairs 5

bench-kueue: $(STAMP) cluster-bin kueue-bin ## the same gangs via builtin admission, via Kueue, and as Kueue pod groups -> bench/results/kueue.json
	$(BIN)/python bench/kueue_bench.py

bench-failover: $(STAMP) cluster-bin ## leader failover: SIGKILL and SIGTERM the leader, 5 rounds each
	$(BIN)/python bench/failover_bench.py

bench-recovery: system-deps $(STAMP) cluster-bin ## full restart vs in place vs in place with a spare, 6 evictions each, interleaved -> bench/results/recovery.json; then bench-node-loss
	$(BIN)/python bench/recovery_bench.py
	$(BIN)/python bench/node_loss_bench.py

bench-node-loss: $(STAMP) cluster-bin ## a lost node: elastic shrink vs a fixed gang waiting for the node, 5 pairs at once -> bench/results/node-loss.json
	$(BIN)/python bench/node_loss_bench.py

bench-goodput: system-deps $(STAMP) cluster-bin ## not in CI, over an hour: 30 min jobs, an eviction every 5 min, in place vs full restart -> bench/results/goodput.json
	$(BIN)/python bench/goodput_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
