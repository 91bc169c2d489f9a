"""``make bench-scale``: gpushare and a kopf-native variant against a real control plane at scale.

Unlike ``benchmarks.ingest`` and ``benchmarks.pods`` (in process, seconds), this one starts etcd
and kube-apiserver, fills them with thousands of realistic GPU Nodes and tens of thousands of
Pods, and runs each variant as its own process through the same phases (cold start, heartbeat
storm, policy rollout, pod churn), measuring RSS, CPU, API writes (from the audit log) and
published-status lag.  It takes minutes to tens of minutes; see ``__main__`` for the knobs.
"""
