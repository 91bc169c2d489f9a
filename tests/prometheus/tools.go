//go:build tools

// Package prometheus pins the Prometheus server and promtool that the alert-rule tests and the
// Prometheus integration test run; tests/prometheus/build.sh builds them from this module.
package prometheus

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
