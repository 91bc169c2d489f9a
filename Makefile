# gpushare developer entry points.  `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

include tests/controlplane/versions.mk

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CONTROLPLANE_DIR := .cache/controlplane/$(CONTROLPLANE_VERSION)
CONTROLPLANE_BIN := $(CONTROLPLANE_DIR)/bin
KUBECTL := $(CONTROLPLANE_BIN)/kubectl
DEV_DIR := .dev-cluster
DEV_KUBECONFIG := $(DEV_DIR)/kubeconfig
CLUSTER ?= dev
PYTEST_ARGS ?=

export GPUSHARE_CONTROLPLANE_BIN := $(abspath $(CONTROLPLANE_BIN))

.PHONY: help
help: ## List the targets with what they do.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e '.[test]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create .venv with the package and its test extra.

.PHONY: controlplane
controlplane: ## Build etcd, kube-apiserver, kubectl, kube-controller-manager and helm from Go modules (cached).
	@bash tests/controlplane/build.sh $(CONTROLPLANE_DIR) $(KUBERNETES_VERSION) $(ETCD_VERSION) $(HELM_VERSION)

.PHONY: lint
lint: venv ## ruff, mypy --strict and the import-linter layer contracts.
	$(VENV)/bin/ruff check operator tests benchmarks
	$(VENV)/bin/ruff format --check operator tests benchmarks
	$(VENV)/bin/mypy --strict operator/gpushare_operator
	$(VENV)/bin/mypy --strict benchmarks
	$(VENV)/bin/lint-imports

.PHONY: fmt
fmt: venv ## Format and auto-fix with ruff.
	$(VENV)/bin/ruff format operator tests benchmarks
	$(VENV)/bin/ruff check --fix operator tests benchmarks

.PHONY: unit
unit: venv ## Unit tests only (no control plane).
	$(VPY) -m pytest tests/unit $(PYTEST_ARGS)

.PHONY: test
test: venv controlplane lint ## Every check and every test, against a real local control plane.
	$(VPY) -m pytest $(PYTEST_ARGS)

BENCH_ARGS ?=

.PHONY: bench
bench: venv ## In-process micro-benchmarks of the ingest paths (table on stdout, JSON in .bench/).
	$(VPY) -m benchmarks $(BENCH_ARGS)

BENCH_SCALE_ARGS ?=

.PHONY: bench-scale
bench-scale: venv controlplane ## Scale benchmark on a local control plane: 5,000 nodes, 50,000 pods, gpushare vs kopf-native (~22 min; JSON + PNG in .bench/). BENCH_SCALE_ARGS=--quick: 500 nodes.
	$(VPY) -m pip install --quiet -e '.[bench]'
	$(VPY) -m benchmarks.scale $(BENCH_SCALE_ARGS)

.PHONY: soak
soak: venv controlplane ## Full-size load tests on their own control plane (3,400 nodes, ~10,200 queued writes, 50,000 pods): Lease renewals under load.
	GPUSHARE_SOAK=1 $(VPY) -m pytest tests/integration/test_lease_load.py $(PYTEST_ARGS)

.PHONY: crds
crds: venv ## Regenerate crds/ and the chart's crds/ from the pydantic models.
	$(VPY) -m gpushare_operator.app.crdgen crds charts/gpushare-operator/crds

.PHONY: dev-cluster
dev-cluster: venv controlplane ## Start the local control plane in the background; kubeconfig in .dev-cluster/.
	$(VPY) -m gpushare_operator.testing.devcluster up --dir $(DEV_DIR) --bin $(CONTROLPLANE_BIN)
	@echo "kubeconfig: $(DEV_KUBECONFIG)"

.PHONY: dev-cluster-down
dev-cluster-down: venv ## Stop the background control plane.
	$(VPY) -m gpushare_operator.testing.devcluster down --dir $(DEV_DIR)

RUN_FLAGS ?= --config-propagation-delay 5 --config-key-grace-period 60

.PHONY: run
run: venv controlplane ## Run the operator in the foreground on the dev cluster with simulated GPU nodes (CLUSTER=current: your kubeconfig).
ifeq ($(CLUSTER),current)
	$(KUBECTL) apply -f crds/
	$(VPY) -m gpushare_operator run --log-format console
else
	@$(MAKE) --no-print-directory dev-cluster
	@$(KUBECTL) --kubeconfig $(DEV_KUBECONFIG) apply -f crds/ >/dev/null
	@$(KUBECTL) --kubeconfig $(DEV_KUBECONFIG) wait --for=condition=established --timeout=60s \
		crd/gpusharingpolicies.gpushare.dev crd/gpunodestates.gpushare.dev >/dev/null
	@$(KUBECTL) --kubeconfig $(DEV_KUBECONFIG) apply -f examples/
	@# The simulator plays the GPU nodes and the NVIDIA agents; it stops with the operator.
	@$(VPY) -m gpushare_operator.testing.demo --kubeconfig $(DEV_KUBECONFIG) \
		--also-namespace gpushare-system & sim=$$!; \
	trap 'kill $$sim 2>/dev/null; wait $$sim 2>/dev/null' EXIT; \
	echo "try: $(KUBECTL) --kubeconfig $(DEV_KUBECONFIG) get gsp,gns"; \
	KUBECONFIG=$(abspath $(DEV_KUBECONFIG)) $(VPY) -m gpushare_operator run --log-format console \
		--namespace gpushare-system $(RUN_FLAGS)
endif

.PHONY: clean
clean: ## Remove the venv and caches (not the control-plane build).
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info
