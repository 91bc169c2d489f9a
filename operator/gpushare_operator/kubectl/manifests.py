"""Planned policies: read from files, then validated by the API server in a dry run.

The API server's answer to a dry run is the object as it would be stored: CRD defaults filled
in, every admission rule applied, the generation moved on when the spec changes.  That answer,
not the file, is what the plan feeds the operator's state, so a plan never disagrees with
admission about what a manifest means.  An existing policy is planned as the file says, the spec
replaced whole (as ``kubectl apply`` and ``kubectl replace`` leave it).

Every name is checked as the API server checks a policy's (kube/objectpaths.py) when the file
is read or the ``--delete`` taken, before any request: a name that could cut ``?dryRun=All`` off
a request's path never reaches one.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpushare_operator.core.api import models
from gpushare_operator.kube import dryrun, http, reading
from gpushare_operator.kube.objectpaths import BadName, checked
from gpushare_operator.kubectl.cluster import POLICIES, read_one
from gpushare_operator.kubectl.permissions import Permission, needing


class ManifestError(ValueError):
    """A file that is not readable YAML, or a policy without a valid name."""


@dataclass(frozen=True, slots=True)
class Planned:
    """One policy as the plan would leave it."""

    name: str
    action: str  # "create", "update" or "delete"
    current: dict[str, Any] | None  # as it is now (None: new)
    answer: dict[str, Any]  # the dry run's answer: what the operator would see


@dataclass(frozen=True, slots=True)
class Refusal:
    """An object the API server refused in the dry run, in its own words."""

    name: str
    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"Error from server ({self.reason}): {self.message}"


def _documents(text: str, *, source: str) -> Iterator[Mapping[str, Any]]:
    try:
        loaded = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ManifestError(f"{source}: not valid YAML: {exc}") from exc
    for document in loaded:
        if document is None:
            continue
        if not isinstance(document, Mapping):
            raise ManifestError(f"{source}: a document is not an object")
        if document.get("kind") == "List" or str(document.get("kind", "")).endswith("List"):
            yield from (item for item in document.get("items") or () if isinstance(item, Mapping))
        else:
            yield document


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def _files(paths: Sequence[str]) -> Iterator[str]:
    """Each path, a directory standing for its manifests (not recursive, as ``kubectl -f``)."""
    for path in paths:
        folder = Path(path)
        if path != "-" and folder.is_dir():
            found = sorted(p for p in folder.iterdir() if p.suffix in MANIFEST_SUFFIXES)
            yield from (str(p) for p in found if p.is_file())
        else:
            yield path


def read_policies(
    paths: Sequence[str], *, stdin: Iterable[str] = sys.stdin
) -> tuple[list[dict[str, Any]], list[str]]:
    """The GPUSharingPolicies in ``paths`` (files, directories of them, or ``-``: standard
    input), and what else was there."""
    policies: list[dict[str, Any]] = []
    skipped: list[str] = []
    for path in _files(paths):
        try:
            text = "".join(stdin) if path == "-" else Path(path).read_text()
        except OSError as exc:
            raise ManifestError(f"{path}: {exc.strerror or exc}") from exc
        for document in _documents(text, source=path):
            kind = document.get("kind")
            group = str(document.get("apiVersion", "")).split("/")[0]
            name = (document.get("metadata") or {}).get("name")
            if kind != models.POLICY_KIND or group != models.GROUP:
                skipped.append(f"{kind or '?'} {name or '?'} ({path})")
                continue
            if not isinstance(name, str) or not name:
                raise ManifestError(f"{path}: a {models.POLICY_KIND} without metadata.name")
            try:
                checked(name, kind=models.POLICY_KIND)
            except BadName as exc:
                raise ManifestError(f"{path}: {exc}") from exc
            policies.append(dict(document))
    return policies, skipped


def _refusal(name: str, exc: http.ApiError) -> Refusal:
    body = exc.body if isinstance(exc.body, Mapping) else {}
    message = str(body.get("message") or exc.body or exc)
    return Refusal(name, exc.status, str(body.get("reason") or exc.reason), message)


def _replacement(document: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """The file's object as an update of ``current``: its resourceVersion (a precondition),
    and the finalizers the file does not mention kept (the operator's among them)."""
    metadata = dict(document.get("metadata") or {})
    known = current.get("metadata") or {}
    metadata["resourceVersion"] = known.get("resourceVersion")
    metadata.setdefault("finalizers", known.get("finalizers") or [])
    return {**document, "metadata": metadata}


def checked_deletions(names: Sequence[str]) -> list[str]:
    """The ``--delete`` names, each a valid policy name (BadName for the first that is not)."""
    return [checked(name, kind=models.POLICY_KIND) for name in names]


def _dry(verb: str, name: str) -> Permission:
    purpose = f"the dry run of {name} (nothing is stored, but RBAC asks for the verb)"
    return Permission(verb=verb, resource=POLICIES, name=name, purpose=purpose)


# How many times an update's dry run is tried when the policy changed between its read and
# the dry run (409): the operator writes a policy's status as its nodes and pods change, so
# a busy policy can change in between; each try reads it again.
CONFLICT_TRIES = 5


async def _dry_run_apply(api: reading.Api, document: Mapping[str, Any]) -> Planned:
    name = str(document["metadata"]["name"])
    tries = CONFLICT_TRIES
    while True:
        current = await read_one(api, POLICIES, name, purpose=f"whether {name} exists, and as what")
        if current is None:
            with needing(_dry("create", name)):
                created = await dryrun.create(api, POLICIES, document)
            return Planned(name, "create", None, created)
        try:
            with needing(_dry("update", name)):
                answer = await dryrun.replace(api, POLICIES, name, _replacement(document, current))
        except http.ApiError as exc:
            tries -= 1
            if exc.status != 409 or tries == 0:
                raise
            continue  # changed since it was read: read it again
        return Planned(name, "update", current, answer)


async def _dry_run_delete(api: reading.Api, name: str) -> Planned:
    current = await read_one(api, POLICIES, name, purpose=f"{name} as it is, to plan its deletion")
    if current is None:
        body = {"reason": "NotFound", "message": f'{models.POLICY_KIND} "{name}" not found'}
        raise http.ApiError(status=404, reason="Not Found", body=body)
    with needing(_dry("delete", name)):
        answer = await dryrun.delete(api, POLICIES, name)
    if not (answer.get("metadata") or {}).get("deletionTimestamp"):
        # No finalizer holds it (the operator never ran): the operator meets the deletion all
        # the same, and releases what the policy governed.
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        answer = {**current, "metadata": {**current["metadata"], "deletionTimestamp": now}}
    return Planned(name, "delete", current, answer)


async def dry_run(
    api: reading.Api, documents: Sequence[Mapping[str, Any]], deletions: Sequence[str]
) -> tuple[list[Planned], list[Refusal]]:
    """Every planned object through the API server, one by one; all refusals are collected,
    so that one run reports every problem of a change set."""
    planned: list[Planned] = []
    refusals: list[Refusal] = []
    jobs: list[tuple[str, Mapping[str, Any] | None, str | None]]
    jobs = [(str(d["metadata"]["name"]), d, None) for d in documents]
    jobs += [(name, None, name) for name in deletions]
    for name, document, deletion in jobs:
        try:
            if document is not None:
                planned.append(await _dry_run_apply(api, document))
            elif deletion is not None:
                planned.append(await _dry_run_delete(api, deletion))
        except http.ApiError as exc:
            refusals.append(_refusal(name, exc))
    return planned, refusals


def for_state(planned: Planned) -> dict[str, Any]:
    """The dry run's answer as the operator's state takes it: without a resourceVersion (a
    dry run's is no newer than what was listed, and the state ignores anything older)."""
    metadata = dict(planned.answer.get("metadata") or {})
    metadata.pop("resourceVersion", None)
    return {**planned.answer, "metadata": metadata}
