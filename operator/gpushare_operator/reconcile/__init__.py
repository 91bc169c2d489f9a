"""Reconcile: from the cache's current state to the writes that would make the cluster match.

Above ``cache`` (which it only reads) and below ``kube`` (which performs the writes): the
planner decides, level-based, what each object should look like and whether that differs from
what the cluster shows; it never talks to the API.
"""
