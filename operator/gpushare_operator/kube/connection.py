"""Connecting to the API: ``$KUBECONFIG`` when set, else the in-cluster ServiceAccount."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from types import TracebackType
from typing import Any

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


DEFAULT_KUBECONFIG = os.path.join("~", ".kube", "config")


class KubeconfigError(ValueError):
    """No usable kubeconfig (or context), and not inside a cluster either."""


def _default_kubeconfig() -> str:
    """``~/.kube/config`` when it exists (one stat, before any connection is open)."""
    path = os.path.expanduser(DEFAULT_KUBECONFIG)
    return path if os.path.exists(path) else ""


async def load_kubectl_configuration(
    *, kubeconfig: str | None = None, context: str | None = None, env: dict[str, str] | None = None
) -> client.Configuration:
    """The cluster as kubectl finds it: ``--kubeconfig``, else ``$KUBECONFIG`` (a list of files,
    merged as kubectl merges them), else ``~/.kube/config``; in-cluster credentials only when
    none of these exists, as kubectl falls back to them.  ``context`` picks a context other
    than the current one.  A kubeconfig is never written back (no refreshed token is saved).
    """
    environ = os.environ if env is None else env
    configuration = client.Configuration()
    if kubeconfig and not os.path.isfile(kubeconfig):  # noqa: ASYNC240 - one stat, no I/O wait
        raise KubeconfigError(f"kubeconfig {kubeconfig}: no such file")
    paths = kubeconfig or environ.get("KUBECONFIG") or _default_kubeconfig()
    try:
        if paths:
            await config.load_kube_config(
                config_file=paths,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        elif context:
            raise KubeconfigError(f"context {context!r} given, but no kubeconfig was found")
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException as exc:
        where = paths or "in-cluster service account (no kubeconfig found)"
        raise KubeconfigError(f"{where}: {exc}") from exc
    return configuration


def api_client(configuration: client.Configuration) -> client.ApiClient:
    return client.ApiClient(configuration=configuration)


# The elector makes one request at a time; a second connection covers a request that hung.
ELECTION_POOL_SIZE = 2


def election_client(configuration: client.Configuration) -> client.ApiClient:
    """A client for leader election alone: its own connection pool, never shared with the
    writer's requests, the informers' watches or kopf, as client-go's and controller-runtime's
    leader election have their own.  Same server and credentials (a copy of ``configuration``,
    whose token refresh hook comes along).  Call it on the loop that will use it."""
    own = copy.deepcopy(configuration)
    own.connection_pool_maxsize = ELECTION_POOL_SIZE
    return client.ApiClient(configuration=own)


def review_client(
    configuration: client.Configuration, *, pool_size: int, user_agent: str
) -> client.ApiClient:
    """A client for the /metrics access reviews alone (kube/access.py): its own ``pool_size``
    connections, so that a flood of reviews never holds a connection the writer, the informers
    or kopf wait for, and never waits for theirs.  A copy of ``configuration``, as
    election_client's.  Its ``user_agent`` tells its requests apart in the API server's audit
    log.  Call it on the loop that will use it."""
    own = copy.deepcopy(configuration)
    own.connection_pool_maxsize = pool_size
    api = client.ApiClient(configuration=own)
    api.user_agent = user_agent
    return api


async def server_version(api: client.ApiClient) -> str:
    info = await client.VersionApi(api).get_code()
    return str(info.git_version)


@dataclass
class ApiHandle:
    """An open API client plus what kopf needs to log in with the same identity."""

    configuration: client.Configuration
    api: client.ApiClient

    @property
    def server(self) -> str:
        return str(self.configuration.host)

    def credentials(self) -> dict[str, Any]:
        """Keyword arguments for ``kopf.ConnectionInfo`` (kopf sits above this layer)."""
        c = self.configuration
        token = (c.api_key or {}).get("BearerToken") or (c.api_key or {}).get("authorization")
        scheme = None
        if token:
            scheme, _, token = (
                str(token).partition(" ") if " " in str(token) else ("Bearer", "", token)
            )
        return {
            "server": c.host,
            "ca_path": c.ssl_ca_cert,
            "insecure": not c.verify_ssl,
            "certificate_path": c.cert_file,
            "private_key_path": c.key_file,
            "scheme": scheme,
            "token": token or None,
        }

    async def __aenter__(self) -> ApiHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.api.close()


async def open_handle(*, kubeconfig: str | None = None) -> ApiHandle:
    configuration = await load_configuration(kubeconfig=kubeconfig)
    return ApiHandle(configuration=configuration, api=api_client(configuration))
