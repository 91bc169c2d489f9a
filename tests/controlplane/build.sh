#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kubectl, kube-controller-manager, kube-scheduler and helm
# from the Go module proxy into $1/bin.
#
# Each binary is built only when missing or stamped with another version (a .NAME.version file
# beside it), so a warm cache costs nothing and a version bump in versions.mk rebuilds.  Static, trimmed
# builds with the version stamped in: the apiserver derives its emulation version from
# gitVersion, and an unstamped build reports v0.0.0-master, which kubectl and the
# apiserver's compatibility checks treat as a different release.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: $0 OUTDIR KUBERNETES_VERSION ETCD_VERSION HELM_VERSION}"
k8s="${2:?}"
etcd="${3:?}"
helm="${4:?}"
mkdir -p "$out/bin"
out="$(cd "$out" && pwd)"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

minor="${k8s#v1.}"; minor="${minor%%.*}"
now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
kv=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kv+=" -X ${pkg}.gitVersion=${k8s} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
  kv+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=${now}"
done

build() {  # build NAME MODULE_DIR PACKAGE LDFLAGS VERSION
  local name="$1" dir="$2" pkg="$3" ldflags="$4" version="$5"
  local stamp="$out/bin/.$name.version"
  if [[ -x "$out/bin/$name" && "$(cat "$stamp" 2>/dev/null)" == "$version" ]]; then
    echo "controlplane: $name $version already built"
    return
  fi
  echo "controlplane: building $name ($pkg)"
  local start=$SECONDS
  (cd "$here/$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out/bin/$name.tmp" "$pkg")
  mv "$out/bin/$name.tmp" "$out/bin/$name"
  echo "$version" > "$stamp"
  echo "controlplane: built $name in $((SECONDS - start)) s"
}

build etcd etcd . "-X go.etcd.io/etcd/api/v3/version.GitSHA=${etcd}" "$etcd"
build kube-apiserver kubernetes k8s.io/kubernetes/cmd/kube-apiserver "$kv" "$k8s"
build kubectl kubernetes k8s.io/kubernetes/cmd/kubectl "$kv" "$k8s"
# Garbage collection (ownerReferences) and namespace deletion only happen in the
# controller manager; without it a deleted namespace stays Terminating for ever.
build kube-controller-manager kubernetes k8s.io/kubernetes/cmd/kube-controller-manager "$kv" "$k8s"
# Pods without spec.nodeName are placed by kube-scheduler only: with it, tests see real
# scheduling (resource fit, taints, affinity) instead of a pod Pending for ever.
build kube-scheduler kubernetes k8s.io/kubernetes/cmd/kube-scheduler "$kv" "$k8s"
# Helm for the chart tests (lint, template, install); its own module again.
# Without the Kubernetes version stamped in, `helm template` assumes v1.20 and refuses charts
# that declare a kubeVersion; stamp the version of the client-go it was built against.
kmod="$(cd "$here/helm" && go list -m -f '{{.Version}}' k8s.io/client-go)"
kminor="${kmod#v0.}"; kminor="${kminor%%.*}"
hv=" -X helm.sh/helm/v3/internal/version.version=${helm}"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  hv+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${kminor}"
done
build helm helm helm.sh/helm/v3/cmd/helm "$hv" "$helm"
