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
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "ngc", "namespace": "gpu-operator"},
        "data": {".dockerconfigjson": base64.b64encode(DOCKER.encode()).decode()},
    }
    assert redact.obj(secret) == {
        "name": "ngc",
        "namespace": "gpu-operator",
        "type": "kubernetes.io/dockerconfigjson",
        "keys": [".dockerconfigjson"],
    }


def test_credential_named_env_and_configmap_keys_are_replaced_the_rest_kept() -> None:
    policy = {
        "kind": "ClusterPolicy",
        "metadata": {"name": "p", "managedFields": [{"manager": "x"}]},
        "spec": {
            "driver": {
                "env": [
                    {"name": "NGC_API_KEY", "value": "nvapi-abc"},
                    {"name": "LICENSE_TOKEN", "value": "tok"},
                    {"name": "DRIVER_TYPE", "value": "passthrough"},
                    {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s"}}},
                ]
            }
        },
    }
    out = redact.obj(policy)
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in out["spec"]["driver"]["env"]}
    assert env == {
        "NGC_API_KEY": redact.REDACTED,
        "LICENSE_TOKEN": redact.REDACTED,
        "DRIVER_TYPE": "passthrough",
        "FROM_SECRET": {"secretKeyRef": {"name": "s"}},
    }
    assert "managedFields" not in out["metadata"]
    cm = {
        "kind": "ConfigMap",
        "metadata": {"name": "licensing-config"},
        "data": {"client_configuration_token.tok": "abc.def", "gridd.conf": "FeatureType=1\n"},
    }
    assert redact.obj(cm)["data"] == {
        "client_configuration_token.tok": redact.REDACTED,
        "gridd.conf": "FeatureType=1\n",
    }


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
    for secret in (
        JWT,
        "hunter2",
        "abc123456",
        "MIIEow",
        base64.b64encode(b"$oauthtoken:nvapi-SECRET").decode(),
    ):
        assert secret not in out, secret
    assert out.count(redact.REDACTED) == 6
    assert "user=admin" in out and "2026-11-24T10:00:00Z" in out  # evidence around them stays


def test_ordinary_evidence_is_left_alone() -> None:
    text = (
        "node gpu-1: driver 580.95.05 not loaded; Fix: set driver.enabled=true. "
        "nvidia.com/gpu.deploy.driver=true, tokenizer pod ok, 0000:3b:00.0 on vfio-pci"
    )
    assert redact.text(text) == text


FORMS = [  # (text, the credential in it, what stays)
    (
        "HTTPS_PROXY=http://proxyuser:pr0xy-pass@proxy.example.com:3128",
        "pr0xy-pass",
        "http://proxyuser:<redacted>@proxy.example.com:3128",
    ),
    ("baseurl=https://u:p%40ss@repo.example.com/el9/", "p%40ss", "@repo.example.com/el9/"),
    ("proxy http://u:we@ird@proxy:8080/", "we@ird", "http://u:<redacted>@proxy:8080/"),
    (
        "clone https://ghp0123456789abcdefXYZ@github.com/o/r.git",
        "ghp0123456789abcdefXYZ",
        "@github.com/o/r.git",
    ),
    ("Authorization: Basic Ym9iOmh1bnRlcjI=", "Ym9iOmh1bnRlcjI=", "Authorization: Basic <redacted>"),
    ('{"Proxy-Authorization": "Basic Ym9iOmh1bnRlcjI="}', "Ym9iOmh1bnRlcjI=", "Proxy-Authorization"),
    ("machine h.example.com login bob password n3trc", "n3trc", "login bob password <redacted>"),
    ("machine h\n  login bob\n  password n3trc2\n", "n3trc2", "login bob"),
    ('{"identitytoken": "idt0k3n"}', "idt0k3n", '"identitytoken": "<redacted>"'),
    ("auths:\n  nvcr.io:\n    auth: YWJjOmRlZg==", "YWJjOmRlZg==", "auth: <redacted>"),
    ("run --token t0k3n-value --v=2", "t0k3n-value", "--token <redacted> --v=2"),
    ("run --password 'pa ss' --v=2", "pa ss", "--v=2"),
    ("run --token=t0k3n-eq", "t0k3n-eq", "--token=<redacted>"),
    ("login --registry-password hunter3", "hunter3", "--registry-password <redacted>"),
    ("NGC_API_KEY=nvapi-xyz DRIVER_TYPE=passthrough", "nvapi-xyz", "DRIVER_TYPE=passthrough"),
    ("MY_SIGNING_KEY=abcdef", "abcdef", "MY_SIGNING_KEY=<redacted>"),
    ("aws_access_key_id = AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE", "aws_access_key_id"),
    (
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG",
        "wJalrXUtnFEMI/K7MDENG",
        "aws_secret_access_key = <redacted>",
    ),
    ("keys ASIAY34FZKBOKMUTVV7A in use", "ASIAY34FZKBOKMUTVV7A", "keys <redacted> in use"),
]


def test_each_credential_form_in_text_is_replaced_and_its_context_kept() -> None:
    for line, credential, kept in FORMS:
        out = redact.text(line)
        assert credential not in out, (line, out)
        assert kept in out, (line, out)


def test_structured_credentials_by_name_and_by_position() -> None:
    ds = {
        "kind": "DaemonSet",
        "metadata": {
            "name": "d",
            "annotations": {
                "example.com/api-token": "t0k",
                "nvidia.com/probe.facts": '{"proxy": "http://u:pw@p:3128"}',
                "example.com/owner": "team-a",
            },
        },
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "args": [
                                "--token",
                                "t0k2",
                                "--password",
                                "pw2",
                                "--token-file",
                                "/run/tok",
                                "--password-stdin",
                                "-v",
                            ],
                            "env": [
                                {"name": "S3_SECRET", "value": "s3"},
                                {"name": "UPLOAD_TOKEN_VALUE", "value": "utv"},
                                {"name": "DB_PASSWD", "value": "dbp"},
                                {"name": "TLS_KEY", "value": "tk"},
                                {"name": "TOKEN_FILE", "value": "/run/tok"},
                                {"name": "HTTP_PROXY", "value": "http://u:pw3@p"},
                            ],
                        }
                    ],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                }
            }
        },
    }
    out = redact.obj(ds)
    notes = out["metadata"]["annotations"]
    assert notes["example.com/api-token"] == redact.REDACTED and notes["example.com/owner"] == "team-a"
    assert json.loads(notes["nvidia.com/probe.facts"]) == {"proxy": "http://u:<redacted>@p:3128"}
    (container,) = out["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "--token",
        redact.REDACTED,
        "--password",
        redact.REDACTED,
        "--token-file",
        "/run/tok",
        "--password-stdin",
        "-v",
    ]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {
        "S3_SECRET": redact.REDACTED,
        "UPLOAD_TOKEN_VALUE": redact.REDACTED,
        "DB_PASSWD": redact.REDACTED,
        "TLS_KEY": redact.REDACTED,
        "TOKEN_FILE": "/run/tok",
        "HTTP_PROXY": "http://u:<redacted>@p",
    }
    assert out["spec"]["template"]["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    custom = redact.obj(
        {
            "kind": "GPUCluster",
            "spec": {
                "password": "pw4",
                "params": {"token": ["t5"]},
                "secretName": "ngc",
                "secretEnv": "driver-env",
            },
        }
    )
    assert custom["spec"] == {
        "password": redact.REDACTED,
        "params": {"token": [redact.REDACTED]},
        "secretName": "ngc",
        "secretEnv": "driver-env",
    }


def test_what_only_looks_like_a_credential_stays() -> None:
    for line in (
        "key: nvidia.com/gpu",
        "http://proxy.example.com:3128/",
        "ssh://git@github.com/o/r",
        "--token-file /var/run/secrets/tok --password-stdin",
        "secretName: ngc-secret",
        "max_tokens=1024 tokenizer=bpe",
        "basic checks passed",
        "user@example.com wrote",
        "automountServiceAccountToken: false",
        "bearerTokenFile: /var/run/secrets/tok",
    ):
        assert redact.text(line) == line
