"""Rollouts: the budget arithmetic, status.rollout, and which pods an eviction takes."""
