"""The one layer that talks to the Kubernetes API: list/watch, writes, leader election."""
