"""A node's phase machine: the labels wanted on it, its GPUNodeState, and its release when no
policy governs it."""
