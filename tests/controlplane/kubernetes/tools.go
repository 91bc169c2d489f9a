//go:build tools

// Package controlplane pins the Kubernetes commands that the gpushare tests run.
// The blank imports keep `go mod tidy` from dropping them; the binaries are built with
// `go build k8s.io/kubernetes/cmd/<name>` from this module.
package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
