"""No credential reaches a support bundle: every form a credential takes in a cluster (URL
credentials of a proxy or a package repository, Authorization headers, netrc, Docker config
fields, `--token`/`--password` arguments, credential-named environment variables and
annotations, AWS keys, JWTs, private keys) is planted in every kind of object `must-gather`
collects, the tarball is built by the collector against a stand-in apiserver that serves them
(container logs included, which kwok nodes cannot serve), and every member of it is scanned.
The planted values are random per run, so no rule can know them; each object's evidence next
to them (proxy host, user, variable names, flags that are no credential) must still be there."""

from __future__ import annotations

import base64
import io
import json
import secrets
import string
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpu_operator.admin import mustgather, redact
from gpu_operator.cli import app
from gpu_operator.controllers.watchedkinds import OWNED_KINDS, SERVICE_MONITOR
from gpu_operator.vocabulary import PROBE_FACTS_ANNOTATION
from tests.support.fakeapi import Answer, kubeconfig, serve

NS = "gpu-operator"


def _value() -> str:
    return "s" + secrets.token_hex(10)


class Planted:
    """One set of credentials, each in the form it takes in the wild, and the text around them
    that is evidence and must stay."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        aws_id = "AKIA" + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16))
        basic = base64.b64encode(f"bob:{_value()}".encode()).decode()
        docker_auth = base64.b64encode(f"$oauthtoken:{_value()}".encode()).decode()
        for name in (
            "proxy",
            "repo",
            "apt",
            "netrc",
            "netrc_lines",
            "identitytoken",
            "registrytoken",
            "docker_password",
            "token_arg",
            "password_arg",
            "token_eq",
            "api_key",
            "token_var",
            "secret_var",
            "password_var",
            "aws_secret",
            "jwt_sig",
            "pem",
            "git_token",
            "yaml_auth",
            "creds_arg",
            "client_secret",
        ):
            self.values[name] = _value()
        self.values |= {"basic": basic, "docker_auth": docker_auth, "aws_id": aws_id}
        v = self.values
        jwt = f"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4eXp6eXp6eSJ9.{v['jwt_sig']}"
        self.values["jwt"] = jwt
        self.lines = [  # free text: a log line, an event message, an annotation, a ConfigMap file
            f"HTTPS_PROXY=http://proxyuser:{v['proxy']}@proxy.example.com:3128",
            f"baseurl=https://repouser:{v['repo']}@repo.example.com/rhel9/x86_64/",
            f"deb https://aptuser:{v['apt']}@apt.example.com/ubuntu jammy main",
            f"GET /v2/ Authorization: Basic {basic}",
            f"machine repo.example.com login bob password {v['netrc']}",
            f"machine mirror.example.com\n  login alice\n  password {v['netrc_lines']}",
            json.dumps(
                {
                    "auths": {
                        "nvcr.io": {"auth": docker_auth, "identitytoken": v["identitytoken"]},
                        "r.example.com": {
                            "username": "carol",
                            "password": v["docker_password"],
                            "registrytoken": v["registrytoken"],
                        },
                    }
                }
            ),
            f"auths:\n  nvcr.io:\n    auth: {v['yaml_auth']}",
            f"exec: /bin/login-helper --token {v['token_arg']} --password {v['password_arg']} "
            f"--token-file /var/run/secrets/tok --password-stdin",
            f"exec: /bin/pull --token={v['token_eq']} --creds dave:{v['creds_arg']}",
            f"env: NGC_API_KEY={v['api_key']} LICENSE_TOKEN_VALUE={v['token_var']} S3_SECRET={v['secret_var']} "
            f"REGISTRY_PASSWORD={v['password_var']} DRIVER_TYPE=passthrough",
            f"[default]\naws_access_key_id = {aws_id}\naws_secret_access_key = {v['aws_secret']}",
            f"client_secret: {v['client_secret']}",
            f"request with Authorization: Bearer {jwt}",
            f"clone https://{v['git_token']}x{v['git_token']}@git.example.com/org/repo.git",
            f"-----BEGIN PRIVATE KEY-----\n{v['pem']}\n-----END PRIVATE KEY-----",
        ]
        self.text = "\n".join(self.lines)
        # must survive: not credentials, and the evidence a bug report needs
        self.evidence = (
            "proxy.example.com:3128",
            "proxyuser",
            "repo.example.com/rhel9/x86_64/",
            "aptuser",
            "NGC_API_KEY",
            "DRIVER_TYPE=passthrough",
            "--token-file /var/run/secrets/tok",
            "--password-stdin",
            "login bob",
            "carol",
        )

    def secrets(self) -> dict[str, str]:
        return self.values

    def env(self) -> list[dict[str, Any]]:
        v = self.values
        return [
            {"name": "NGC_API_KEY", "value": v["api_key"]},
            {"name": "LICENSE_TOKEN_VALUE", "value": v["token_var"]},
            {"name": "S3_SECRET", "value": v["secret_var"]},
            {"name": "REGISTRY_PASSWORD", "value": v["password_var"]},
            {"name": "AWS_ACCESS_KEY_ID", "value": v["aws_id"]},
            {"name": "AWS_SECRET_ACCESS_KEY", "value": v["aws_secret"]},
            {"name": "HTTPS_PROXY", "value": f"http://proxyuser:{v['proxy']}@proxy.example.com:3128"},
            {"name": "DRIVER_TYPE", "value": "passthrough"},
            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "ngc", "key": "password"}}},
        ]

    def args(self) -> list[str]:
        v = self.values
        return [
            "--token",
            v["token_arg"],
            "--password",
            v["password_arg"],
            f"--token={v['token_eq']}",
            "--creds",
            f"dave:{v['creds_arg']}",
            "--token-file",
            "/var/run/secrets/tok",
            "--password-stdin",
        ]

    def annotations(self) -> dict[str, str]:
        out = {f"example.com/note-{i}": line for i, line in enumerate(self.lines)}
        return out | {
            "example.com/api-token": self.values["git_token"],
            "example.com/registry-password": self.values["docker_password"],
        }

    def pod_spec(self) -> dict[str, Any]:
        return {
            "nodeName": "gpu-0",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/x:1",
                    "env": self.env(),
                    "args": self.args(),
                    "command": ["sh", "-c", "\n".join(self.lines)],
                }
            ],
        }


def _object(kind: str, name: str, planted: Planted, namespace: str | None = NS) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "annotations": planted.annotations(),
        "labels": {"app.kubernetes.io/managed-by": "gpu-operator"},
    }
    if namespace:
        meta["namespace"] = namespace
    obj: dict[str, Any] = {"metadata": meta}
    if kind in ("DaemonSet", "Deployment", "Job"):
        obj["spec"] = {
            "template": {"metadata": {"annotations": planted.annotations()}, "spec": planted.pod_spec()}
        }
    elif kind == "Pod":
        obj["spec"] = planted.pod_spec()
        obj["status"] = {
            "phase": "Running",
            "containerStatuses": [{"name": "main", "restartCount": 1}],
            "message": planted.text,
        }
    elif kind in ("ClusterPolicy", "NVIDIADriver"):
        obj["spec"] = {
            "driver": {
                "env": planted.env(),
                "args": planted.args(),
                "repoConfig": {"configMapName": "repo-config"},
                "licensingConfig": {"secretName": "licensing", "nlsEnabled": True},
            },
            "toolkit": {"env": planted.env()},
        }
        obj["status"] = {"state": "notReady", "conditions": [{"type": "Error", "message": planted.text}]}
    elif kind == "ConfigMap":
        obj["data"] = {
            "cuda.repo": planted.lines[1],
            "sources.list": planted.lines[2],
            "netrc": planted.text,
            "config.json": planted.lines[6],
            "credentials": planted.lines[11],
            "notes.txt": planted.text,
        }
    elif kind == "ServiceMonitor":
        obj["spec"] = {
            "endpoints": [
                {
                    "port": "metrics",
                    "bearerTokenFile": "/var/run/secrets/tok",
                    "params": {"token": [planted.values["token_arg"]]},
                }
            ]
        }
    elif kind == "GPUCluster":
        obj["spec"] = {"note": planted.text, "password": planted.values["password_var"]}
    else:
        obj["spec"] = {"note": planted.text}
    return obj


def _route(planted: Planted) -> Any:
    kinds = {k.plural: k.kind for k in (*OWNED_KINDS, SERVICE_MONITOR, *mustgather.IN_NAMESPACE)}
    kinds |= {k.plural: k.kind for k in mustgather.OWNERS}
    facts = json.dumps(
        {
            "driverSource": "none",
            "proxy": f"http://proxyuser:{planted.values['proxy']}@proxy.example.com:3128",
            "gpus": [{"address": "0000:3b:00.0"}],
        }
    )
    node = {
        "metadata": {
            "name": "gpu-0",
            "labels": {"nvidia.com/gpu.present": "true"},
            "annotations": {
                **{f"nvidia.com/note-{i}": line for i, line in enumerate(planted.lines)},
                "nvidia.com/registry-token": planted.values["registrytoken"],
                PROBE_FACTS_ANNOTATION: facts,
            },
        },
        "status": {"conditions": [{"type": "Ready", "status": "True", "message": planted.text}]},
    }

    def event(name: str, kind: str, involved: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": NS},
            "involvedObject": {"kind": kind, "name": involved},
            "reason": "Planted",
            "type": "Warning",
            "message": planted.text,
            "count": 1,
            "source": {"component": "gpu-operator"},
            "lastTimestamp": "2026-12-01T00:00:00Z",
        }

    def route(path: str) -> Answer:
        if path == "/version":
            return 200, {"gitVersion": "v1.36.3"}
        if path.endswith("/log"):
            return 200, planted.text + "\n"
        parts = path.strip("/").split("/")
        plural = parts[-1]
        namespaced = "namespaces" in parts
        if plural == "nodes":
            return 200, {"items": [node], "metadata": {}}
        if plural == "events":
            items = [event("ev-ns", "Pod", "p")] if namespaced else [event("ev-node", "Node", "gpu-0")]
            return 200, {"items": items, "metadata": {}}
        if plural == "secrets":
            return 200, {
                "items": [
                    {
                        "metadata": {"name": "ngc", "namespace": NS},
                        "type": "Opaque",
                        "stringData": {"password": planted.values["docker_password"]},
                        "data": {"token": base64.b64encode(planted.values["token_arg"].encode()).decode()},
                    }
                ],
                "metadata": {},
            }
        if plural in kinds:
            kind = kinds[plural]
            name = f"{kind.lower()}-{'ns' if namespaced else 'cluster'}"
            return 200, {"items": [_object(kind, name, planted, NS if namespaced else None)], "metadata": {}}
        return 200, {"items": [], "metadata": {}}

    return route


def _tarball(route: Any, tmp_path: Path) -> dict[str, str]:
    out = tmp_path / "bundle.tar.gz"
    with serve(route) as server:
        result = CliRunner().invoke(
            app,
            [
                "must-gather",
                "--out",
                str(out),
                "--namespace",
                NS,
                "--kubeconfig",
                str(kubeconfig(tmp_path / "kubeconfig", server)),
            ],
        )
    assert result.exit_code == 0, result.output
    with tarfile.open(fileobj=io.BytesIO(out.read_bytes())) as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def _readable(path: str, content: str) -> str:
    """A member's text as a reader sees it: a YAML file's strings one by one (YAML folds long
    lines), other files as they are."""
    if not path.endswith(".yaml"):
        return content
    strings: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                strings.append(str(k))
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        else:
            strings.append(str(value))

    walk(yaml.safe_load(content))
    return "\n".join(strings)


def test_no_planted_credential_reaches_any_member_of_the_tarball(tmp_path: Path) -> None:
    planted = Planted()
    files = _tarball(_route(planted), tmp_path)

    # every kind the collector reads is in the bundle, with the planted object in it
    expected = {f"cluster/{k.kind}.yaml" for k in mustgather.OWNERS}
    expected |= {f"owned/{k.kind}.yaml" for k in (*OWNED_KINDS, SERVICE_MONITOR)}
    expected |= {f"namespaces/{NS}/{k.kind}.yaml" for k in mustgather.IN_NAMESPACE}
    expected |= {
        f"namespaces/{NS}/secrets.yaml",
        f"namespaces/{NS}/events.yaml",
        "nodes.yaml",
        "nodes/gpu-0/events.txt",
        "nodes/gpu-0/probe-facts.json",
        "logs/pod-ns/main.log",
        "logs/pod-ns/main.previous.log",
    }
    assert expected <= set(files), sorted(expected - set(files))

    texts = {path: content + "\n" + _readable(path, content) for path, content in files.items()}
    leaks = {
        (path, form)
        for path, text in texts.items()
        for form, value in planted.secrets().items()
        if value in text
    }
    assert not leaks, sorted(leaks)

    # what is not a credential is still there: in the logs, the events, every object
    for path in expected - {
        f"namespaces/{NS}/secrets.yaml",
        "nodes/gpu-0/probe-facts.json",
        "owned/ServiceMonitor.yaml",
    }:
        missing = [e for e in planted.evidence if e not in texts[path]]
        assert not missing, (path, missing)
    facts = json.loads(files["nodes/gpu-0/probe-facts.json"])
    assert facts["proxy"] == "http://proxyuser:<redacted>@proxy.example.com:3128"
    assert facts["gpus"] == [{"address": "0000:3b:00.0"}]
    # a toleration's key is no credential
    assert "key: nvidia.com/gpu" in files[f"namespaces/{NS}/DaemonSet.yaml"]
    assert "secretName: licensing" in files["cluster/ClusterPolicy.yaml"]


def test_the_scan_finds_a_credential_that_gets_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan above can fail: with the text rules off, the planted values are found."""
    planted = Planted()
    monkeypatch.setattr(redact, "_PATTERNS", ())
    files = _tarball(_route(planted), tmp_path)
    for form in ("proxy", "netrc", "token_arg", "aws_id", "identitytoken"):
        assert any(planted.values[form] in content for content in files.values()), form
