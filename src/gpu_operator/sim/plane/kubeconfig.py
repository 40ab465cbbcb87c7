"""Writes kubeconfig files for the simulated control plane (client certificate, bearer token or token file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca: Path,
    user: str,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    token: str | None = None,
    token_file: Path | None = None,
) -> Path:
    credentials: dict[str, Any] = {}
    if client_cert and client_key:
        credentials = {"client-certificate": str(client_cert), "client-key": str(client_key)}
    if token:
        credentials["token"] = token
    if token_file:
        credentials["tokenFile"] = str(token_file)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "sim", "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
