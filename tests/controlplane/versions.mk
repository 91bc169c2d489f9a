# Pinned control-plane versions; the cache directory is keyed on both.
KUBERNETES_VERSION := v1.35.4
ETCD_VERSION := v3.6.16
CONTROLPLANE_VERSION := $(KUBERNETES_VERSION)-etcd$(ETCD_VERSION)
HELM_VERSION := v3.22.0
