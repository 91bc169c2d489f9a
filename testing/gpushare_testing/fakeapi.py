"""An in-memory stand-in for ``kube.http.request``: enough API server for unit tests.

Objects live in a dict by path; PUT is a compare-and-swap on ``metadata.resourceVersion``, as the
real API server does, so election logic can be tested against conflicts without a network.
"""

from __future__ import annotations

import copy
from typing import Any

from gpushare_operator.kube import http


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self._version = 0
        self.fail_with: int | None = None  # answer every call with this status

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        return obj

    async def request(
        self, api: object, *, method: str, path: str, body: Any = None, **_: Any
    ) -> Any:
        self.calls.append((method, path))
        if self.fail_with is not None:
            raise http.ApiError(status=self.fail_with, reason="fake", body={})
        if method == "GET":
            if path not in self.objects:
                raise http.ApiError(status=404, reason="NotFound", body={"reason": "NotFound"})
            return copy.deepcopy(self.objects[path])
        if method == "POST":
            name = body["metadata"]["name"]
            key = f"{path}/{name}"
            if key in self.objects:
                raise http.ApiError(status=409, reason="AlreadyExists", body={})
            self.objects[key] = self._bump(copy.deepcopy(body))
            return copy.deepcopy(self.objects[key])
        if method == "PUT":
            current = self.objects.get(path)
            if current is None:
                raise http.ApiError(status=404, reason="NotFound", body={})
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise http.ApiError(status=409, reason="Conflict", body={"reason": "Conflict"})
            self.objects[path] = self._bump(copy.deepcopy(body))
            return copy.deepcopy(self.objects[path])
        raise AssertionError(f"unexpected {method} {path}")
