"""The simulator's PKI for the kube/ tests that talk TLS to a local server (tlskit.py: the
server's TLS context and a kubeconfig that reaches it)."""

from __future__ import annotations

import pytest

from gpu_operator.sim.plane import pki as simpki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> simpki.Pki:
    return simpki.generate(tmp_path_factory.mktemp("pki"))
