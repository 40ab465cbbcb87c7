"""Hypothesis: hundreds of valid ClusterPolicy specs all render, with the renderer's invariants."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_operator.render import ObjectRef, render
from gpu_operator.vocabulary import MANAGED_BY, STATE_LABEL
from tests.unit.render.renderkit import facts, policy

KEYS = {"repos": ("a.list",), "certs": ("c.crt",)}
FACTS = {
    "gpu": facts("dgx-h100:2", "host-driver:1", "cpu:1", configmap_keys=KEYS),
    "none": facts("cpu:1"),
    "ocp": facts("dgx-h100:1", openshift=True, openshift_version="4.19", configmap_keys=KEYS),
}
flag = st.none() | st.booleans()
name = st.sampled_from(["a", "cfg", "x-1"])
env_list = st.lists(
    st.builds(
        lambda n, v: {"name": n, "value": v},
        st.sampled_from(["A", "B", "MIG_STRATEGY"]),
        st.sampled_from(["", "1", "x"]),
    ),
    max_size=2,
)
image = st.sampled_from(
    [
        {},
        {"repository": "r.example", "image": "i", "version": "1.0"},
        {"repository": "r.example", "image": "i", "version": "sha256:" + "a" * 64},
        {"image": "r.example/full:2"},
    ]
)


def component(**extra: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    base = st.fixed_dictionaries(
        {},
        optional={
            "enabled": flag,
            "imagePullPolicy": st.sampled_from(["Always", "IfNotPresent", "Never"]),
            "imagePullSecrets": st.lists(name, max_size=2),
            "args": st.lists(st.just("--v"), max_size=1),
            "env": env_list,
            "resources": st.just({"limits": {"cpu": "1", "memory": "1Gi"}}),
            "hostNetwork": flag,
            **extra,
        },
    )
    return st.tuples(base, image).map(lambda t: {**t[0], **t[1]})


specs = st.fixed_dictionaries(
    {},
    optional={
        "operator": st.fixed_dictionaries({}, optional={"runtimeClass": st.sampled_from(["nvidia", "gpu"])}),
        "daemonsets": st.fixed_dictionaries(
            {},
            optional={
                "updateStrategy": st.sampled_from(["RollingUpdate", "OnDelete"]),
                "rollingUpdate": st.sampled_from([{"maxUnavailable": "1"}, {"maxUnavailable": "10%"}]),
                "labels": st.just({"team": "gpu"}),
                "priorityClassName": st.just("high"),
            },
        ),
        "driver": component(
            usePrecompiled=flag,
            kernelModuleType=st.sampled_from(["auto", "open", "proprietary"]),
            rdma=st.fixed_dictionaries({}, optional={"enabled": flag, "useHostMofed": flag}),
            useNvidiaDriverCRD=flag,
            secretEnv=name,
            licensingConfig=st.sampled_from(
                [{"secretName": "l"}, {"configMapName": "l", "nlsEnabled": False}]
            ),
            repoConfig=st.just({"configMapName": "repos"}),
            certConfig=st.just({"name": "certs"}),
            kernelModuleConfig=st.just({"name": "k"}),
            virtualTopology=st.just({"config": "t"}),
        ),
        "toolkit": component(installDir=st.sampled_from(["/usr/local/nvidia", "/opt/nvidia"])),
        "devicePlugin": component(
            config=st.sampled_from([{}, {"name": "dp"}, {"name": "dp", "default": "x"}]),
            mps=st.sampled_from([{"root": "/run/nvidia/mps"}, {"root": "/run/mps"}]),
        ),
        "dcgm": component(hostPort=st.just(5555)),
        "dcgmExporter": component(
            serviceMonitor=st.just({"enabled": True}),
            enablePodLabels=flag,
            hpcJobMapping=st.just({"enabled": True}),
            config=st.just({"name": "m"}),
        ),
        "gfd": component(),
        "migManager": component(config=st.sampled_from([{}, {"name": "mig"}])),
        "nodeStatusExporter": component(),
        "validator": component(),
        "mig": st.sampled_from([{}, {"strategy": "none"}, {"strategy": "single"}, {"strategy": "mixed"}]),
        "gds": component(),
        "gdrcopy": component(),
        "cdi": st.fixed_dictionaries({}, optional={"enabled": flag, "nriPluginEnabled": flag}),
        "sandboxWorkloads": st.fixed_dictionaries(
            {},
            optional={
                "enabled": flag,
                "defaultWorkload": st.sampled_from(["container", "vm-passthrough", "vm-vgpu"]),
                "mode": st.sampled_from(["kubevirt", "kata"]),
            },
        ),
        "vfioManager": component(),
        "sandboxDevicePlugin": component(),
        "vgpuDeviceManager": component(),
        "vgpuManager": component(),
        "kataSandboxDevicePlugin": component(),
        "ccManager": component(defaultMode=st.sampled_from(["on", "off", "devtools"])),
        "hostPaths": st.fixed_dictionaries(
            {},
            optional={
                "rootFS": st.sampled_from(["/", "/host"]),
                "driverInstallDir": st.sampled_from(["", "/opt/d"]),
            },
        ),
    },
)


def valid(spec: dict[str, Any]) -> bool:
    """The cross-field rules the CRD enforces with CEL."""
    cdi, toolkit = spec.get("cdi", {}), spec.get("toolkit", {})
    if cdi.get("nriPluginEnabled") and (cdi.get("enabled") is False or toolkit.get("enabled") is False):
        return False
    precompiled = spec.get("driver", {}).get("usePrecompiled")
    return not (
        precompiled and (spec.get("gds", {}).get("enabled") or spec.get("gdrcopy", {}).get("enabled"))
    )


@settings(
    max_examples=520,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(spec=specs.filter(valid), cluster=st.sampled_from(sorted(FACTS)))
def test_valid_specs_render(spec: dict[str, Any], cluster: str) -> None:
    result = render(policy(spec), FACTS[cluster])
    assert len(result.states) == 20
    seen: set[ObjectRef] = set()
    for state in result.states:
        refs = [ObjectRef.of(o) for o in state.objects]
        assert len(set(refs)) == len(refs)
        assert not set(refs) & seen  # no object belongs to two states
        seen.update(refs)
        for obj in state.objects:
            assert obj["metadata"]["labels"][MANAGED_BY] == "gpu-operator"
            assert obj["metadata"]["labels"][STATE_LABEL] == state.name
            if obj["kind"] == "DaemonSet":
                selector = obj["spec"]["template"]["spec"]["nodeSelector"]
                assert any(k.startswith("nvidia.com/gpu.deploy.") for k in selector)
                assert all(c["image"] for c in obj["spec"]["template"]["spec"]["containers"])
        if not state.enabled:
            assert state.objects == []
    if cluster == "none":
        assert not any(o["kind"] == "DaemonSet" for o in result.objects())
