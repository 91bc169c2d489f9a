# The pinned Prometheus module (tests/prometheus/go.mod requires the same); its v0.3MM.P is
# Prometheus 3.MM.P.  The cache directory is keyed on it, and each binary carries a version stamp.
PROMETHEUS_VERSION := v0.316.0
