# Pinned control-plane versions; the cache directory is keyed on Kubernetes and etcd, and each
# binary carries a version stamp, so bumping any of them (helm too) rebuilds what changed.
KUBERNETES_VERSION := v1.37.2
ETCD_VERSION := v3.6.16
CONTROLPLANE_VERSION := $(KUBERNETES_VERSION)-etcd$(ETCD_VERSION)
HELM_VERSION := v3.22.0
