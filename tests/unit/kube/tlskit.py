"""A local TLS server's context and a kubeconfig that reaches it, for the kube/ tests that talk
TLS (the PKI is conftest.py's `pki` fixture)."""

from __future__ import annotations

import ssl
from pathlib import Path

from gpu_operator.sim.plane import pki as simpki
from gpu_operator.sim.plane.kubeconfig import write_kubeconfig


def server_tls(pki: simpki.Pki) -> ssl.SSLContext:
    """A local server's TLS: the PKI's serving certificate, a client certificate asked for."""
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca_cert))
    tls.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))
    tls.verify_mode = ssl.CERT_OPTIONAL
    return tls


def admin_kubeconfig(pki: simpki.Pki, path: Path, url: str) -> Path:
    """A kubeconfig at `path` for the server at `url`, as `admin` (client certificate)."""
    return write_kubeconfig(
        path,
        server=url,
        ca=pki.ca_cert,
        user="u",
        client_cert=pki.client_cert("admin"),
        client_key=pki.client_key("admin"),
    )
