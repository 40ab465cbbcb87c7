"""A support bundle carries no credential: Secrets as names and key names, credential-named
environment variables and ConfigMap keys replaced, tokens and keys in any text replaced, and
everything else left as it was (a redaction that eats the evidence is no better)."""

from __future__ import annotations

import base64
import json

from gpu_operator.admin import redact

JWT = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEyMyJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6eCJ9.c2lnbmF0dXJlc2lnbmF0dXJl"
DOCKER = json.dumps({"auths": {"nvcr.io": {"auth": base64.b64encode(b"$oauthtoken:nvapi-SECRET").decode()}}})


def test_a_secret_keeps_its_name_type_and_key_names_only() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
              "metadata": {"name": "ngc", "namespace": "gpu-operator"},
              "data": {".dockerconfigjson": base64.b64encode(DOCKER.encode()).decode()}}
    assert redact.obj(secret) == {"name": "ngc", "namespace": "gpu-operator",
                                  "type": "kubernetes.io/dockerconfigjson", "keys": [".dockerconfigjson"]}


def test_credential_named_env_and_configmap_keys_are_replaced_the_rest_kept() -> None:
    policy = {"kind": "ClusterPolicy", "metadata": {"name": "p", "managedFields": [{"manager": "x"}]},
              "spec": {"driver": {"env": [{"name": "NGC_API_KEY", "value": "nvapi-abc"},
                                          {"name": "LICENSE_TOKEN", "value": "tok"},
                                          {"name": "DRIVER_TYPE", "value": "passthrough"},
                                          {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}}}
    out = redact.obj(policy)
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in out["spec"]["driver"]["env"]}
    assert env == {"NGC_API_KEY": redact.REDACTED, "LICENSE_TOKEN": redact.REDACTED, "DRIVER_TYPE": "passthrough",
                   "FROM_SECRET": {"secretKeyRef": {"name": "s"}}}
    assert "managedFields" not in out["metadata"]
    cm = {"kind": "ConfigMap", "metadata": {"name": "licensing-config"},
          "data": {"client_configuration_token.tok": "abc.def", "gridd.conf": "FeatureType=1\n"}}
    assert redact.obj(cm)["data"] == {"client_configuration_token.tok": redact.REDACTED, "gridd.conf": "FeatureType=1\n"}


def test_tokens_in_free_text_are_replaced() -> None:
    lines = [
        f"2026-11-24T10:00:00Z request with Authorization: Bearer {JWT}",
        f"projected token {JWT} mounted",
        f"docker config {DOCKER}",
        "connect: password=hunter2 user=admin",
        '{"token": "abc123456"}',
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    ]
    out = redact.text("\n".join(lines))
    for secret in (JWT, "hunter2", "abc123456", "MIIEow", base64.b64encode(b"$oauthtoken:nvapi-SECRET").decode()):
        assert secret not in out, secret
    assert out.count(redact.REDACTED) == 6
    assert "user=admin" in out and "2026-11-24T10:00:00Z" in out  # evidence around them stays


def test_ordinary_evidence_is_left_alone() -> None:
    text = ("node gpu-1: driver 580.95.05 not loaded; Fix: set driver.enabled=true. "
            "nvidia.com/gpu.deploy.driver=true, tokenizer pod ok, 0000:3b:00.0 on vfio-pci")
    assert redact.text(text) == text
