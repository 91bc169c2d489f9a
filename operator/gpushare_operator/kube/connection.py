"""Connecting to the API: ``$KUBECONFIG`` when set, else the in-cluster ServiceAccount."""

from __future__ import annotations

import os

from kubernetes_asyncio import client, config


async def load_configuration(*, kubeconfig: str | None = None) -> client.Configuration:
    """One client configuration shared by the informers, the writer and kopf's login."""
    configuration = client.Configuration()
    path = kubeconfig if kubeconfig is not None else os.environ.get("KUBECONFIG")
    if path:
        await config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


def api_client(configuration: client.Configuration) -> client.ApiClient:
    return client.ApiClient(configuration=configuration)


async def server_version(api: client.ApiClient) -> str:
    info = await client.VersionApi(api).get_code()
    return str(info.git_version)
