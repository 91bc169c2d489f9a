# gpushare developer entry points.  `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

include tests/controlplane/versions.mk
include tests/prometheus/versions.mk

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CONTROLPLANE_DIR := .cache/controlplane/$(CONTROLPLANE_VERSION)
CONTROLPLANE_BIN := $(CONTROLPLANE_DIR)/bin
KUBECTL := $(CONTROLPLANE_BIN)/kubectl
PROMETHEUS_DIR := .cache/prometheus/$(PROMETHEUS_VERSION)
PROMETHEUS_BIN := $(PROMETHEUS_DIR)/bin
DEV_DIR := .dev-cluster
DEV_KUBECONFIG := $(DEV_DIR)/kubeconfig
CLUSTER ?= dev
PYTEST_ARGS ?=
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

export GPUSHARE_CONTROLPLANE_BIN := $(abspath $(CONTROLPLANE_BIN))
export GPUSHARE_PROMETHEUS_BIN := $(abspath $(PROMETHEUS_BIN))

.PHONY: help
help: ## List the targets with what they do.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "Variables: CLUSTER=current (make run on your kubeconfig's context), NAMESPACE (its"
	@echo "  namespace, default gpushare-system), IMAGE, BASE_IMAGE (make image), PYTEST_ARGS."

# The operator (with its test tools) and, as a distribution of its own, the test support: the
# local control plane and the GPU simulator, which the operator's wheel and image never hold.
$(VENV)/.installed: pyproject.toml testing/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e '.[test]' -e ./testing
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create .venv with the package and its test extra.

.PHONY: controlplane
controlplane: ## Build etcd, kube-apiserver, kubectl, kube-controller-manager, kube-scheduler and helm from Go modules (cached).
	@bash tests/controlplane/build.sh $(CONTROLPLANE_DIR) $(KUBERNETES_VERSION) $(ETCD_VERSION) $(HELM_VERSION)

.PHONY: prometheus
prometheus: ## Build prometheus and promtool from their Go module (cached), for the alert-rule tests and the Prometheus integration test.
	@bash tests/prometheus/build.sh $(PROMETHEUS_DIR) $(PROMETHEUS_VERSION)

MIG_TABLES_DIR := .cache/miggeometry

.PHONY: mig-tables
mig-tables: ## Print go-nvml's MIG tables as JSON (the Go exporter in tests/miggeometry, built once and cached; core/hardware/migtables.json is this plus NVIDIA's corrections).
	@bash tests/miggeometry/build.sh $(MIG_TABLES_DIR)
	@$(MIG_TABLES_DIR)/miggeometry

.PHONY: lint
lint: venv ## ruff, mypy --strict, the import-linter layer contracts and checkov on the chart.
	$(VENV)/bin/ruff check operator testing tests benchmarks
	$(VENV)/bin/ruff format --check operator testing tests benchmarks
	$(VENV)/bin/mypy --strict operator/gpushare_operator
	$(VENV)/bin/mypy --strict testing/gpushare_testing
	$(VENV)/bin/mypy --strict benchmarks
	$(VENV)/bin/lint-imports
	@$(MAKE) --no-print-directory checkov

# checkov pins packaging<24, and pytest 9 needs packaging>=24: in .venv it would hold pytest
# back, so it has a venv of its own. Pinned, so that a release's new checks come in by choice.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := .venv-checkov
CHART := charts/gpushare-operator
# The values the chart is scanned with, one --set each ("defaults" sets nothing): the defaults,
# the monitoring objects on (ServiceMonitor, dashboard, PrometheusRule), the webhook off, an
# image by digest, plain-HTTP metrics.
CHART_SCANS := defaults \
	serviceMonitor.enabled=true,metricsCertSecret=metrics-tls,grafanaDashboard.enabled=true,prometheusRule.enabled=true \
	webhook.enabled=false \
	image.digest=sha256:$(shell printf '0%.0s' $$(seq 64)) \
	operator.metricsInsecure=true,serviceMonitor.enabled=true

$(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION):
	rm -rf $(CHECKOV_VENV)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/pip install --quiet checkov==$(CHECKOV_VERSION)
	touch $@

# One file per scan: checkov's graph checks (a pod's NetworkPolicy) would otherwise match a
# resource of one rendering with another's.  --skip-download: nothing is fetched from its vendor.
.PHONY: checkov
checkov: $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION) controlplane ## checkov (kubernetes checks) on the chart rendered with each of CHART_SCANS: no failed check; a skip says why in the object's checkov.io/skip annotation.
	@out=$$(mktemp -d) && trap 'rm -rf "$$out"' EXIT && \
	for values in $(CHART_SCANS); do \
		set=$$([ "$$values" = defaults ] || echo "--set $$values"); \
		$(CONTROLPLANE_BIN)/helm template gs $(CHART) --namespace gpushare-system \
			--kube-version $(KUBERNETES_VERSION) $$set >"$$out/chart.yaml" || exit 1; \
		echo "checkov: the chart with $$values"; \
		$(CHECKOV_VENV)/bin/checkov --framework kubernetes --file "$$out/chart.yaml" \
			--quiet --compact --skip-download || exit 1; \
	done

.PHONY: fmt
fmt: venv ## Format and auto-fix with ruff.
	$(VENV)/bin/ruff format operator testing tests benchmarks
	$(VENV)/bin/ruff check --fix operator testing tests benchmarks

.PHONY: unit
unit: venv prometheus ## Unit tests only (no control plane; promtool for the alert rules).
	$(VPY) -m pytest tests/unit $(PYTEST_ARGS)

# Integration tests mostly wait on the control plane: three pytest-xdist workers, each with a
# control plane of its own on free ports, share the files out (tests/conftest.py says how).
# TEST_WORKERS=0 runs them in this process, one after another.  Bytecode is written even where
# PYTHONDONTWRITEBYTECODE is set: every operator and plugin process a test starts would compile
# the package again (half a second of CPU each, hundreds of times).
TEST_WORKERS ?= 3

.PHONY: test
test: venv controlplane prometheus lint ## Every check and every test, against a real local control plane (3 workers).
	PYTHONDONTWRITEBYTECODE= $(VPY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder --durations=30 $(PYTEST_ARGS)

BENCH_ARGS ?=

.PHONY: bench
bench: venv controlplane ## Ingest micro-benchmarks, and the operator process's CPU per event on a local control plane (tables on stdout, JSON in .bench/).
	$(VPY) -m benchmarks $(BENCH_ARGS)

BENCH_SCALE_ARGS ?=

.PHONY: bench-scale
bench-scale: venv controlplane ## Scale benchmark on a local control plane: 5,000 nodes, 50,000 pods, gpushare vs kopf-native (~40 min; JSON + PNG in .bench/; --skip relist,delayed,paced,webhook leaves those out). BENCH_SCALE_ARGS=--quick: 500 nodes; '--only webhook': the memory-request webhook's admission latency alone (~12 min).
	$(VPY) -m pip install --quiet -e '.[bench]'
	$(VPY) -m benchmarks.scale $(BENCH_SCALE_ARGS)

.PHONY: dashboard-preview
dashboard-preview: venv controlplane prometheus ## Draw the Grafana dashboard's panels into docs/images/dashboard-preview.png (matplotlib), from a real Prometheus over tests/integration/test_prometheus_alerts.py's scenario (~1 min).
	$(VPY) -m pip install --quiet -e '.[bench]'
	GPUSHARE_DASHBOARD_PREVIEW=$(abspath docs/images/dashboard-preview.png) \
		$(VPY) -m pytest tests/integration/test_prometheus_alerts.py -p no:randomly $(PYTEST_ARGS)

BENCH_PLUGIN_ARGS ?=

.PHONY: bench-plugin
bench-plugin: venv controlplane ## `kubectl gpushare plan` on the scale cluster (5,000 nodes, 50,000 pods; ~10 min): wall time and peak RSS (JSON in .bench/). BENCH_PLUGIN_ARGS=--quick: 500 nodes.
	$(VPY) -m benchmarks.plugin_plan $(BENCH_PLUGIN_ARGS)

.PHONY: soak
soak: venv controlplane ## Full-size soaks: Lease renewals under load (3,400 nodes, 50,000 pods), 5,000 nodes and 200 policies created and deleted 3 times (memory back to baseline), 10 minutes of random rollout sequences (the promise from the audit log), and the whole 60 s /metrics token flood.
	GPUSHARE_SOAK=1 $(VPY) -m pytest tests/integration/test_lease_load.py tests/unit/test_soak.py \
		tests/integration/test_promise_property.py tests/integration/test_metrics_flood.py $(PYTEST_ARGS)

.PHONY: crds
crds: venv ## Regenerate crds/ and the chart's crds/ from the pydantic models.
	$(VPY) -m gpushare_operator.app.crdgen crds charts/gpushare-operator/crds

.PHONY: dev-cluster
dev-cluster: venv controlplane ## Start the local control plane in the background; kubeconfig in .dev-cluster/.
	$(VPY) -m gpushare_testing.devcluster up --dir $(DEV_DIR) --bin $(CONTROLPLANE_BIN)
	@echo "kubeconfig: $(DEV_KUBECONFIG)"

.PHONY: dev-cluster-down
dev-cluster-down: venv ## Stop the background control plane.
	$(VPY) -m gpushare_testing.devcluster down --dir $(DEV_DIR)

RUN_FLAGS ?= --config-propagation-delay 5 --config-key-grace-period 60 --metrics-insecure \
	--webhook-hosts 127.0.0.1,localhost
NAMESPACE ?= gpushare-system
# CLUSTER=current runs with the memory-request webhook off (--webhook-port 0): your cluster's
# API server cannot call a webhook on this machine.  CURRENT_RUN_FLAGS may turn it back on.
CURRENT_RUN_FLAGS ?=

ifeq ($(CLUSTER),current)
# Your cluster: any kubectl on PATH will do; only without one is the control plane built for its.
PATH_KUBECTL := $(shell command -v kubectl 2>/dev/null)
RUN_KUBECTL := $(if $(PATH_KUBECTL),$(PATH_KUBECTL),$(abspath $(KUBECTL)))
RUN_NEEDS := venv $(if $(PATH_KUBECTL),,controlplane)
else
RUN_NEEDS := venv controlplane
endif

.PHONY: run
run: $(RUN_NEEDS) ## Run the operator in the foreground on the dev cluster with simulated GPU nodes (CLUSTER=current: your kubeconfig's context).
ifeq ($(CLUSTER),current)
	@# kubectl defaults to ~/.kube/config; the operator reads $$KUBECONFIG only: give it the same.
	@export KUBECONFIG="$${KUBECONFIG:-$$HOME/.kube/config}"; \
	context=$$($(RUN_KUBECTL) config current-context) || \
		{ echo "make run CLUSTER=current: no current context in $$KUBECONFIG" >&2; exit 1; }; \
	server=$$($(RUN_KUBECTL) config view --minify -o jsonpath='{.clusters[0].cluster.server}'); \
	echo "kubectl:   $(RUN_KUBECTL)"; \
	echo "context:   $$context ($$server)"; \
	echo "namespace: $(NAMESPACE)"; \
	$(RUN_KUBECTL) get namespace $(NAMESPACE) >/dev/null 2>&1 || \
		$(RUN_KUBECTL) create namespace $(NAMESPACE) || exit 1; \
	$(RUN_KUBECTL) apply --server-side --force-conflicts -f crds/ || exit 1; \
	$(RUN_KUBECTL) wait --for=condition=established --timeout=60s \
		crd/gpusharingpolicies.gpushare.dev crd/gpunodestates.gpushare.dev >/dev/null || exit 1; \
	exec $(VPY) -m gpushare_operator run --log-format console --namespace $(NAMESPACE) \
		--webhook-port 0 $(CURRENT_RUN_FLAGS)
else
	@$(MAKE) --no-print-directory dev-cluster
	@$(KUBECTL) --kubeconfig $(DEV_KUBECONFIG) apply -f crds/ >/dev/null
	@$(KUBECTL) --kubeconfig $(DEV_KUBECONFIG) wait --for=condition=established --timeout=60s \
		crd/gpusharingpolicies.gpushare.dev crd/gpunodestates.gpushare.dev >/dev/null
	@$(KUBECTL) --kubeconfig $(DEV_KUBECONFIG) apply -f examples/
	@# The simulator plays the GPU nodes and the NVIDIA agents; it stops with the operator.
	@$(VPY) -m gpushare_testing.demo --kubeconfig $(DEV_KUBECONFIG) \
		--also-namespace gpushare-system & sim=$$!; \
	trap 'kill $$sim 2>/dev/null; wait $$sim 2>/dev/null' EXIT; \
	echo "try: $(KUBECTL) --kubeconfig $(DEV_KUBECONFIG) get gsp,gns"; \
	echo "     curl localhost:8443/metrics   (plain HTTP here: --metrics-insecure)"; \
	KUBECONFIG=$(abspath $(DEV_KUBECONFIG)) $(VPY) -m gpushare_operator run --log-format console \
		--namespace gpushare-system $(RUN_FLAGS)
endif

# -- the container image ---------------------------------------------------------------------------

IMAGE ?= localhost/gpushare-operator:$(VERSION)
# The Dockerfile's own default is python:3.11-slim; this one is built here from Debian's
# packages (scripts/image-base.sh), so `make image` needs no container registry.
LOCAL_BASE_IMAGE := localhost/gpushare-base:bookworm-python3
BASE_IMAGE ?= $(LOCAL_BASE_IMAGE)
IMAGE_CACHE := .cache/image
# No daemon here: buildah, its images in vfs storage (works inside a container, no overlay).
# vfs stores every image whole: the previous build's image, untagged by a rebuild, is pruned.
BUILDAH := buildah --storage-driver vfs
# A pip CA bundle (a TLS-inspecting proxy's) or index mirror configured here is handed to pip
# inside the build; elsewhere these are empty and pip reaches PyPI as usual.
PIP_CERT ?= $(shell $(PYTHON) -m pip config get global.cert 2>/dev/null)
IMAGE_PIP_ARGS := $(if $(PIP_CERT),--volume $(abspath $(PIP_CERT)):/run/gpushare-build/pip-ca.crt:ro \
	--build-arg PIP_CERT=/run/gpushare-build/pip-ca.crt) \
	$(if $(PIP_INDEX_URL),--build-arg PIP_INDEX_URL=$(PIP_INDEX_URL))

.PHONY: buildah
buildah:
	@command -v buildah >/dev/null || { \
		echo "installing buildah (Debian package)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null; }

.PHONY: image
image: buildah ## Build the operator's OCI image with buildah (localhost/gpushare-operator:<version>); reports build time and size.
	@started=$$(date +%s); \
	if [ "$(BASE_IMAGE)" = "$(LOCAL_BASE_IMAGE)" ]; then \
		bash scripts/image-base.sh $(IMAGE_CACHE) $(LOCAL_BASE_IMAGE) || exit 1; \
	fi; \
	$(BUILDAH) bud --isolation chroot --quiet --build-arg BASE_IMAGE=$(BASE_IMAGE) \
		$(IMAGE_PIP_ARGS) --tag $(IMAGE) --file Dockerfile . >/dev/null || exit 1; \
	$(BUILDAH) rmi --prune >/dev/null 2>&1 || true; \
	size=$$($(BUILDAH) images --format '{{.Size}}' $(IMAGE)); \
	echo "image: $(IMAGE) built in $$(( $$(date +%s) - started )) s; size $$size (base $(BASE_IMAGE))"

.PHONY: image-test
image-test: venv controlplane buildah ## Run the image (buildah run, host network) on a local control plane: it starts, leads, configures a simulated node.
	GPUSHARE_IMAGE=$(IMAGE) $(VPY) -m pytest tests/integration/image_smoke.py $(PYTEST_ARGS)

.PHONY: clean
clean: ## Remove the venv and caches (not the control-plane build).
	rm -rf $(VENV) $(CHECKOV_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info testing/*.egg-info
