"""Realistic Pod bodies: shared-GPU inference pods and the CPU-only pods around them.

Like ``bodies`` (the Nodes), deterministic for a given name, and complete: every part a real
pod carries (managedFields, probes, volumes, status), so that a benchmark of pod ingest measures
what the operator meets in a real cluster.
"""

from __future__ import annotations

from datetime import timedelta

import orjson
import yaml

from gpushare_testing.bodyparts import (
    GPU_RESOURCE,
    SHARED_GPU_RESOURCE,
    Body,
    creation_time,
    managed_entry,
    name_digest,
    octet,
    rfc3339,
    uuid_of,
)

__all__ = ["GPU_RESOURCE", "SHARED_GPU_RESOURCE", "plain_pod", "shared_gpu_pod"]


# What does not vary between the pods of a Deployment, as its manifest would say it.  Parsed
# once; each pod gets a fresh copy (an orjson round trip), so no two bodies share a mutable part.
_POD_TEMPLATE = orjson.dumps(
    yaml.safe_load(
        """
        metadata:
          labels: {app.kubernetes.io/component: server, app.kubernetes.io/part-of: platform}
          annotations: {prometheus.io/port: "8000", prometheus.io/scrape: "true"}
          ownerReferences:
          - {apiVersion: apps/v1, kind: ReplicaSet, controller: true, blockOwnerDeletion: true}
        spec:
          dnsPolicy: ClusterFirst
          enableServiceLinks: true
          preemptionPolicy: PreemptLowerPriority
          priority: 0
          restartPolicy: Always
          schedulerName: default-scheduler
          securityContext: {fsGroup: 1000, runAsNonRoot: true, runAsUser: 1000}
          terminationGracePeriodSeconds: 30
          tolerations:
          - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute,
             tolerationSeconds: 300}
          - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute,
             tolerationSeconds: 300}
          volumes:
          - {name: models, persistentVolumeClaim: {claimName: model-cache, readOnly: true}}
          - {name: dshm, emptyDir: {medium: Memory, sizeLimit: 16Gi}}
          - name: kube-api-access
            projected:
              defaultMode: 420
              sources:
              - serviceAccountToken: {expirationSeconds: 3607, path: token}
              - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
              - downwardAPI:
                  items:
                  - {path: namespace, fieldRef: {apiVersion: v1, fieldPath: metadata.namespace}}
        container:
          args: [--port, "8000", --max-model-len, "8192", --gpu-memory-utilization, "0.45"]
          env:
          - {name: HF_HOME, value: /models/.cache}
          - {name: OMP_NUM_THREADS, value: "4"}
          - {name: NCCL_DEBUG, value: WARN}
          - {name: POD_NAME, valueFrom: {fieldRef: {apiVersion: v1, fieldPath: metadata.name}}}
          ports: [{name: http, containerPort: 8000, protocol: TCP}]
          readinessProbe: &probe
            httpGet: {path: /health, port: 8000, scheme: HTTP}
            periodSeconds: 10
            timeoutSeconds: 2
            successThreshold: 1
            failureThreshold: 3
          livenessProbe: *probe
          volumeMounts:
          - {name: models, mountPath: /models, readOnly: true}
          - {name: dshm, mountPath: /dev/shm}
          - name: kube-api-access
            mountPath: /var/run/secrets/kubernetes.io/serviceaccount
            readOnly: true
          terminationMessagePath: /dev/termination-log
          terminationMessagePolicy: File
          imagePullPolicy: IfNotPresent
          securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
        """
    )
)


def shared_gpu_pod(
    *,
    name: str,
    node: str | None,
    namespace: str = "default",
    resource: str = SHARED_GPU_RESOURCE,
    count: int = 1,
    phase: str = "Running",
    init_count: int = 0,
    sidecar_count: int = 0,
    managed_fields: bool = True,
) -> Body:
    """An inference Pod with ``count`` of ``resource`` in its app container's ``limits``.

    Only limits, as people write it (the API server copies extended-resource limits into
    requests on admission, and the operator must count either).  ``init_count`` and
    ``sidecar_count`` add a regular and a restartable (sidecar) init container with that request,
    for the scheduler's effective-request rule; 0 leaves that container out.  ``node`` binds it
    through ``spec.nodeName``, the way the scheduler does; ``None`` leaves it unscheduled.
    """
    containers = [("server", "docker.io/vllm/vllm-openai:v0.8.4", count, "")]
    if init_count:
        containers.append(("fetch-model", "ghcr.io/acme/model-fetcher:1.8.2", init_count, "init"))
    if sidecar_count:
        containers.append(("proxy", "ghcr.io/acme/router:4.2.0", sidecar_count, "sidecar"))
    body = _pod(name=name, namespace=namespace, node=node, phase=phase, app="vllm-inference")
    spec = body["spec"]
    template = spec.pop("containers")[0]
    spec["tolerations"].insert(
        0, {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    )
    for container_name, image, request, role in containers:
        container = {"name": container_name, "image": image, **orjson.loads(orjson.dumps(template))}
        container["resources"]["limits"][resource] = str(request)
        if role == "sidecar":
            container["restartPolicy"] = "Always"
        spec.setdefault("initContainers" if role else "containers", []).append(container)
    return _finish_pod(body, phase=phase, managed_fields=managed_fields)


def plain_pod(
    *,
    name: str,
    node: str | None,
    namespace: str = "default",
    phase: str = "Running",
    managed_fields: bool = True,
) -> Body:
    """A CPU-only web Pod: most of any cluster's Pods, which the operator must skip cheaply."""
    body = _pod(name=name, namespace=namespace, node=node, phase=phase, app="storefront")
    body["spec"]["containers"][0] |= {"name": "web", "image": "ghcr.io/acme/storefront:2.14.1"}
    return _finish_pod(body, phase=phase, managed_fields=managed_fields)


def _pod(*, name: str, namespace: str, node: str | None, phase: str, app: str) -> Body:
    """A pod of ``app`` with one unnamed container; the callers name and equip the containers."""
    key = f"{namespace}/{name}"
    digest = name_digest(key, "pod")
    created = creation_time(key)
    template_hash = name_digest(app, "template")[:10]
    loaded = orjson.loads(_POD_TEMPLATE)
    metadata, spec, container = loaded["metadata"], loaded["spec"], loaded["container"]
    container["resources"] = {
        "limits": {"cpu": "8", "memory": "48Gi"},
        "requests": {"cpu": "4", "memory": "32Gi"},
    }
    metadata["labels"] |= {"app.kubernetes.io/name": app, "pod-template-hash": template_hash}
    metadata["annotations"]["kubectl.kubernetes.io/restartedAt"] = rfc3339(created)
    metadata["ownerReferences"][0] |= {
        "name": f"{app}-{template_hash}",
        "uid": uuid_of(name_digest(app, "replicaset")),
    }
    spec |= {"containers": [container], "serviceAccount": app, "serviceAccountName": app}
    if node is not None:
        spec["nodeName"] = node
    identity = {"name": name, "generateName": f"{app}-{template_hash}-", "namespace": namespace}
    identity |= {"uid": uuid_of(digest), "creationTimestamp": rfc3339(created)}
    return {"kind": "Pod", "apiVersion": "v1", "metadata": identity | metadata, "spec": spec}


def _finish_pod(body: Body, *, phase: str, managed_fields: bool) -> Body:
    """Add what kubelet reports, and who wrote which field, once the spec is complete."""
    metadata, spec = body["metadata"], body["spec"]
    body["status"] = status = _pod_status(spec=spec, phase=phase, key=metadata["uid"])
    if managed_fields:
        at = metadata["creationTimestamp"]
        owned = {k: v for k, v in metadata.items() if k in ("labels", "annotations")}
        owned |= {k: v for k, v in metadata.items() if k in ("generateName", "ownerReferences")}
        metadata["managedFields"] = [
            managed_entry("kube-controller-manager", at, {"metadata": owned, "spec": spec}),
            managed_entry(
                "kubelet", status.get("startTime", at), {"status": status}, subresource="status"
            ),
        ]
    return body


def _pod_status(*, spec: Body, phase: str, key: str) -> Body:
    if "nodeName" not in spec:
        message = "0/12 nodes are available: 12 Insufficient nvidia.com/gpu.shared."
        unscheduled: Body = {"type": "PodScheduled", "status": "False", "lastProbeTime": None}
        unscheduled |= {"reason": "Unschedulable", "message": message}
        return {"phase": "Pending", "qosClass": "Burstable", "conditions": [unscheduled]}
    digest = name_digest(key, "status")
    at = rfc3339(creation_time(key) + timedelta(seconds=3))
    up = "True" if phase == "Running" else "False"
    kinds = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    values = (up, "True", up, up, "True")
    host_ip = f"10.{octet(digest, 6)}.{octet(digest, 8)}.{octet(digest, 10) or 1}"
    pod_ip = f"100.{octet(digest, 0) % 64 + 64}.{octet(digest, 2)}.{octet(digest, 4)}"
    state = {
        "Running": {"running": {"startedAt": at}},
        "Pending": {"waiting": {"reason": "ContainerCreating"}},
    }.get(phase, {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": at}})
    statuses = []
    for container in spec["containers"]:
        image = container["image"]
        statuses.append(
            {
                "name": container["name"],
                "image": image,
                "imageID": f"{image.rsplit(':', 1)[0]}@sha256:{name_digest(image, 'image')}",
                "containerID": f"containerd://{name_digest(container['name'], digest)}",
                "ready": phase == "Running",
                "started": phase == "Running",
                "restartCount": 0,
                "lastState": {},
                "state": state,
            }
        )
    return {
        "phase": phase,
        "conditions": [
            {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": at}
            for kind, value in zip(kinds, values, strict=True)
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "qosClass": "Burstable",
        "startTime": at,
        "containerStatuses": statuses,
    }
