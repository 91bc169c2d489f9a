"""Label rules: Kubernetes' label key and value syntax, label sets, the labels NVIDIA's agents
rewrite, and node selectors compiled once per policy generation."""
