"""kopf's credentials, from the same place our own client takes them.

kopf's bundled service-account login names the apiserver `https://kubernetes.default.svc`, which
needs cluster DNS, and reads the token at that one moment. In a pod, client-go (and lightkube's
in-cluster config, which `Kube` uses) reach the apiserver at KUBERNETES_SERVICE_HOST and
KUBERNETES_SERVICE_PORT, which the kubelet sets in every container: no DNS needed, so the
operator works before CoreDNS does (or without it, with hostNetwork). kopf calls the login
handler again on a 401, so a rotated projected token is read again then.
"""

from __future__ import annotations

import os
from typing import Any

import kopf

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def in_cluster_server(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The apiserver's URL from the Service environment the kubelet sets; None outside a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """A kubeconfig (KUBECONFIG or ~/.kube/config) first, then the pod's ServiceAccount."""
    found = kopf.login_with_kubeconfig(**kwargs)
    if found is not None:
        return found
    server, token_path = in_cluster_server(), f"{SERVICE_ACCOUNT}/token"
    if server is None or not os.path.exists(token_path):
        return kopf.login_with_service_account(**kwargs)  # kopf's own, as a last resort
    with open(token_path, encoding="utf-8") as handle:
        token = handle.read().strip()
    namespace = None
    if os.path.exists(f"{SERVICE_ACCOUNT}/namespace"):
        with open(f"{SERVICE_ACCOUNT}/namespace", encoding="utf-8") as handle:
            namespace = handle.read().strip() or None
    ca = f"{SERVICE_ACCOUNT}/ca.crt"
    settings = kwargs.get("settings")
    return kopf.ConnectionInfo(
        server=server,
        ca_path=ca if os.path.exists(ca) else None,
        token=token or None,
        default_namespace=namespace,
        trust_env=bool(settings.networking.trust_env) if settings else True,
        priority=20,
    )  # kopf's rank for service-account logins
