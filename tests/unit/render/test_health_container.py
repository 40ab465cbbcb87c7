"""The health agent's container in the operator-validator DaemonSet (docs/node-agents.md, The health agent)."""

from __future__ import annotations

from typing import Any

from tests.unit.render import renderkit


def validator(spec: dict[str, Any]) -> dict[str, Any]:
    return renderkit.daemonset(renderkit.run(spec), "state-operator-validation", "nvidia-operator-validator")


def health(ds: dict[str, Any]) -> dict[str, Any]:
    pod = ds["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]].count("gpu-health") == 1
    return renderkit.ctr(ds, "gpu-health")


def env(ctr: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ctr["env"]}


def test_the_health_container_runs_our_image_with_what_it_reads() -> None:
    ds = validator({})
    ctr = health(ds)
    main = ds["spec"]["template"]["spec"]["containers"][0]
    assert ctr["image"] == main["image"] and ctr["command"] == ["gpu-operator", "node", "health"]
    assert ctr["args"] == ["--host-root", "/host"]
    values = env(ctr)
    assert values["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert values["HEALTH_VALIDATIONS"] == "driver,toolkit,cuda,plugin"
    assert values["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert [(m["name"], m["mountPath"], m.get("readOnly")) for m in ctr["volumeMounts"]] == [
        ("host-root", "/host", True),
        ("host-run", "/host/run", None),
    ]  # /run writable: kured's sentinel
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["host-run"]["hostPath"] == {"path": "/run", "type": "Directory"}
    assert ctr["securityContext"]["privileged"] is True
    assert [p["containerPort"] for p in ctr["ports"]] == [int(values["HEALTH_METRICS_PORT"])]


def test_without_a_device_plugin_the_plugin_status_file_is_not_expected() -> None:
    ctr = health(validator({"devicePlugin": {"enabled": False}}))
    assert env(ctr)["HEALTH_VALIDATIONS"] == "driver,toolkit,cuda"
