"""Deleting test objects that may already be gone: a 404 is fine, any other error is not."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError


def delete_if_present(kube: Client, resource: Any, name: str, namespace: str | None = None) -> None:
    try:
        kube.delete(resource, name, namespace=namespace)
    except ApiError as err:
        if err.status.code != 404:
            raise
