"""The gpushare.dev/v1alpha1 API: the models the CRDs are generated from (with their CEL rules),
their status halves, and the defaults and durations the operator and the plugin share."""
