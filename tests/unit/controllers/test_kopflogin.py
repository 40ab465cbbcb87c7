"""kopf logs in where our client does: in a pod, at KUBERNETES_SERVICE_HOST:PORT with the
ServiceAccount's token (no cluster DNS needed), reading the token at each login."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest

from gpu_operator.controllers import kopflogin


def test_the_apiserver_address_comes_from_the_service_environment() -> None:
    assert (
        kopflogin.in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
        == "https://10.0.0.1:443"
    )
    assert (
        kopflogin.in_cluster_server({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
        == "https://[fd00::1]:443"
    )
    assert kopflogin.in_cluster_server({}) is None


def test_a_pod_logs_in_with_its_token_at_the_service_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("first\n")
    (account / "namespace").write_text("gpu-operator")
    (account / "ca.crt").write_text("")
    monkeypatch.setattr(kopflogin, "SERVICE_ACCOUNT", str(account))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    settings = kopf.OperatorSettings()
    info = kopflogin.login(settings=settings, logger=None)
    assert info is not None
    assert (info.server, info.token, info.default_namespace, info.ca_path) == (
        "https://10.0.0.1:443",
        "first",
        "gpu-operator",
        str(account / "ca.crt"),
    )
    (account / "token").write_text("rotated\n")  # the kubelet refreshed the projected token
    again = kopflogin.login(settings=settings, logger=None)
    assert again is not None and again.token == "rotated"
