//go:build tools

// Package helm pins the Helm CLI that the chart tests run (`helm lint`, `helm template`,
// `helm install`); the binary is built with `go build helm.sh/helm/v3/cmd/helm`.
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
