"""NVIDIADriver rendering: pools per OS (per kernel when precompiled), names, selectors, routing, CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.cli import app
from gpu_operator.render import RenderError
from gpu_operator.render.driverowners import route
from gpu_operator.render.nvidiadriver import (
    OWNER_LABEL,
    daemonset_name,
    fnv32a,
    image_reference,
    node_pools,
    pools_of,
    render_nvidiadriver,
    safe_encode,
)
from tests.unit.render.renderkit import ctr, env_of, facts, policy

DIGEST = "sha256:" + "ab" * 32  # a digest of the real length

UID = "7f3c2a9e-1b0d-4c55-9a77-0e4f5d6c8b21"


def nvd(name: str = "pool-a", uid: str | None = UID, **spec: Any) -> NVIDIADriver:
    meta: dict[str, Any] = {"name": name}
    if uid:
        meta["uid"] = uid
    return NVIDIADriver.model_validate({"metadata": meta, "spec": spec})


def daemonsets(result: Any) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for s in pools_of(result) for o in s.objects}


def test_name_hash_is_fnv32a_safe_encoded() -> None:
    assert fnv32a("") == 0x811C9DC5 and fnv32a("a") == 0xE40C292C  # the FNV-1a reference vectors
    # apimachinery's SafeEncodeString maps byte b to alphabet[b % 27]: '0' (48) -> '4', '9' (57) -> 'f'
    assert safe_encode("0123456789") == "456789bcdf"
    pool = node_pools(nvd(), facts("dgx-h100:1").gpu_nodes)[0][0]
    name = daemonset_name(nvd(), pool)
    assert name == f"nvidia-gpu-driver-ubuntu22.04-{safe_encode(str(fnv32a(UID)))}"
    assert len(name) <= 63


def test_one_daemonset_per_os_pool_with_the_pool_selector() -> None:
    result = render_nvidiadriver(nvd(version="570.172.08"), facts("dgx-h100:2", "host-driver:1"))
    by_name = daemonsets(result)
    assert len(by_name) == 2
    selectors = {n: d["spec"]["template"]["spec"]["nodeSelector"] for n, d in by_name.items()}
    images = {ctr(d, "nvidia-driver-ctr")["image"] for d in by_name.values()}
    assert images == {
        "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04",
        "nvcr.io/nvidia/driver:570.172.08-ubuntu24.04",
    }
    for selector in selectors.values():
        assert selector[OWNER_LABEL] == "pool-a"
        assert selector["nvidia.com/gpu.present"] == "true"
        assert selector["nvidia.com/gpu.deploy.driver"] == "true"
        assert selector["feature.node.kubernetes.io/system-os_release.ID"] == "ubuntu"
    assert sorted(
        s["feature.node.kubernetes.io/system-os_release.VERSION_ID"] for s in selectors.values()
    ) == ["22.04", "24.04"]
    for ds in by_name.values():  # the same driver state renders it: OnDelete, anti-affinity, digest
        assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
        assert ds["spec"]["selector"]["matchLabels"]["app"] == ds["metadata"]["name"]
        assert ds["spec"]["template"]["metadata"]["labels"]["app"] == ds["metadata"]["name"]
        assert "DRIVER_CONFIG_DIGEST" in env_of(ctr(ds, "nvidia-driver-ctr"))
        assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "nvidia-gpu-driver-pool-a"
        volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        assert (
            volumes["driver-startup-probe-script"]["configMap"]["name"]
            == "nvidia-gpu-driver-pool-a-startup-probe"
        )
    shared = {(o["kind"], o["metadata"]["name"]) for o in result.state("state-driver").objects}
    assert ("ConfigMap", "nvidia-gpu-driver-pool-a-startup-probe") in shared
    assert ("ServiceAccount", "nvidia-gpu-driver-pool-a") in shared


def test_precompiled_splits_per_kernel() -> None:
    result = render_nvidiadriver(
        nvd(usePrecompiled=True, version="570"), facts("dgx-h100:2", "host-driver:1")
    )
    by_name = daemonsets(result)
    assert len(by_name) == 2
    kernels = {
        d["spec"]["template"]["spec"]["nodeSelector"]["feature.node.kubernetes.io/kernel-version.full"]
        for d in by_name.values()
    }
    assert kernels == {"5.15.0-119-generic", "6.8.0-48-generic"}
    images = sorted(ctr(d, "nvidia-driver-ctr")["image"] for d in by_name.values())
    assert images == [
        "nvcr.io/nvidia/driver:570-5.15.0-119-generic-ubuntu22.04",
        "nvcr.io/nvidia/driver:570-6.8.0-48-generic-ubuntu24.04",
    ]
    assert all(d["metadata"]["labels"]["nvidia.com/precompiled"] == "true" for d in by_name.values())


def test_node_selector_and_owned_nodes_choose_the_pool_members() -> None:
    cluster = facts("dgx-h100:2,pool=a", "host-driver:1,pool=b")
    only_b = render_nvidiadriver(nvd(nodeSelector={"pool": "b"}), cluster)
    assert [s.reason for s in pools_of(only_b)] == ["nodes: host-driver-0"]
    ds = next(iter(daemonsets(only_b).values()))
    assert ds["spec"]["template"]["spec"]["nodeSelector"]["pool"] == "b"
    owned = render_nvidiadriver(nvd(), cluster, owned=["dgx-h100-1"])
    assert [s.reason for s in pools_of(owned)] == ["nodes: dgx-h100-1"]
    none = render_nvidiadriver(nvd(nodeSelector={"pool": "c"}), cluster)
    assert not pools_of(none)
    assert any("matches no GPU node" in w for w in none.warnings)


def test_fields_reach_the_driver_pod() -> None:
    spec: dict[str, Any] = {
        "repository": "registry.example.com/nv",
        "image": "driver",
        "version": DIGEST,
        "kernelModuleType": "open",
        "rdma": {"enabled": True},
        "imagePullSecrets": ["regcred"],
        "licensingConfig": {"name": "licensing", "nlsEnabled": True},
        "secretEnv": "drv-env",
        "tolerations": [{"key": "pool", "operator": "Exists"}],
        "priorityClassName": "pc",
        "labels": {"team": "ml"},
        "annotations": {"note": "x"},
        "env": [{"name": "FOO", "value": "1"}],
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}},
    }
    ds = next(iter(daemonsets(render_nvidiadriver(nvd(**spec), facts("dgx-h100:1"))).values()))
    pod = ds["spec"]["template"]["spec"]
    main = ctr(ds, "nvidia-driver-ctr")
    assert main["image"] == f"registry.example.com/nv/driver@{DIGEST}"
    assert env_of(main)["KERNEL_MODULE_TYPE"] == "open" and env_of(main)["FOO"] == "1"
    assert env_of(main)["GPU_DIRECT_RDMA_ENABLED"] == "true"
    assert {c["name"] for c in pod["containers"]} == {"nvidia-driver-ctr", "nvidia-peermem-ctr"}
    assert main["envFrom"] == [{"secretRef": {"name": "drv-env"}}]
    assert {"name": "regcred"} in pod["imagePullSecrets"]
    assert pod["tolerations"] == [
        {"key": "pool", "operator": "Exists"},
        {"key": "nvidia.com/gpu-unhealthy", "operator": "Exists"},
    ]  # + the health quarantine's
    assert pod["priorityClassName"] == "pc"
    assert ds["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    assert ds["spec"]["template"]["metadata"]["annotations"]["note"] == "x"
    assert "nodeAffinity" in pod["affinity"] and "podAntiAffinity" in pod["affinity"]
    assert any(
        v["name"] == "licensing-config" and v["configMap"]["name"] == "licensing" for v in pod["volumes"]
    )


def test_image_reference_rules() -> None:
    assert image_reference(nvd().spec) == "nvcr.io/nvidia/driver"
    assert image_reference(nvd(version="570").spec) == "nvcr.io/nvidia/driver:570"
    assert image_reference(nvd(repository="r.io/x", image="drv", version="1").spec) == "r.io/x/drv:1"


def test_base_policy_supplies_cluster_settings() -> None:
    base = policy(
        {
            "validator": {"repository": "v.io", "image": "validator", "version": "9"},
            "hostPaths": {"rootFS": "/host-root"},
        }
    )
    ds = next(iter(daemonsets(render_nvidiadriver(nvd(version="1"), facts("dgx-h100:1"), base)).values()))
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["host-root"]["hostPath"]["path"] == "/host-root"


def test_vgpu_host_manager_uses_the_vgpu_manager_state() -> None:
    result = render_nvidiadriver(nvd(driverType="vgpu-host-manager", version="17.0"), facts("dgx-h100:1"))
    ds = next(iter(daemonsets(result).values()))
    assert ds["metadata"]["name"].startswith("nvidia-vgpu-host-manager-driver-ubuntu22.04-")
    assert ctr(ds, "nvidia-vgpu-manager-ctr")["image"] == "nvcr.io/nvidia/driver:17.0-ubuntu22.04"
    assert ds["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.deploy.vgpu-manager"] == "true"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"default": True, "nodeSelector": {"pool": "a"}}, "spec.nodeSelector"),
        ({"nodeSelector": {OWNER_LABEL: "x"}}, f"spec.nodeSelector.{OWNER_LABEL}"),
        ({"usePrecompiled": True, "gds": {"enabled": True}}, "spec.usePrecompiled"),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(RenderError) as err:
        render_nvidiadriver(nvd(**spec), facts("dgx-h100:1"))
    assert err.value.field_path == field


def test_routing_unique_selector_then_default_and_conflicts() -> None:
    drivers = [
        nvd("a", nodeSelector={"pool": "a"}),
        nvd("b", nodeSelector={"pool": "b"}),
        nvd("wide", nodeSelector={"gpu": "yes"}),
        nvd("fallback", default=True),
    ]
    nodes = {"n1": {"pool": "a"}, "n2": {"pool": "b"}, "n3": {"pool": "a", "gpu": "yes"}, "n4": {}}
    routing = route(drivers, nodes)
    assert routing.owners == {"n1": "a", "n2": "b", "n4": "fallback"}
    assert routing.conflicts == {"n3": ("a", "wide")}
    assert routing.conflicts_of("wide") == {"n3": ("a", "wide")}
    two_defaults = route([nvd("d1", default=True), nvd("d2", default=True)], {"n": {}})
    assert two_defaults.conflicts == {"n": ("d1", "d2")} and not two_defaults.owners


def test_cli_renders_nvidiadrivers_per_pool(tmp_path: Path) -> None:
    path = tmp_path / "drivers.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [
                {
                    "apiVersion": "nvidia.com/v1alpha1",
                    "kind": "NVIDIADriver",
                    "metadata": {"name": "a"},
                    "spec": {"version": "570.172.08", "nodeSelector": {"pool": "a"}},
                },
                {
                    "apiVersion": "nvidia.com/v1alpha1",
                    "kind": "NVIDIADriver",
                    "metadata": {"name": "b"},
                    "spec": {"version": "580.82.07", "nodeSelector": {"pool": "b"}},
                },
            ]
        )
    )
    out = CliRunner().invoke(
        app,
        [
            "render",
            "--nvidiadriver",
            str(path),
            "--shape",
            "dgx-h100:2,pool=a",
            "--shape",
            "dgx-h100:1,pool=b",
        ],
    )
    assert out.exit_code == 0, out.output
    docs = [d for d in yaml.safe_load_all(out.output) if d]
    found = {
        ctr(d, "nvidia-driver-ctr")["image"]: d["spec"]["template"]["spec"]["nodeSelector"][OWNER_LABEL]
        for d in docs
        if d["kind"] == "DaemonSet"
    }
    assert found == {
        "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04": "a",
        "nvcr.io/nvidia/driver:580.82.07-ubuntu22.04": "b",
    }
    assert "# state pool ubuntu22.04: enabled (nodes: dgx-h100-0, dgx-h100-1)" in out.output
    assert "# state pool ubuntu22.04: enabled (nodes: dgx-h100-2)" in out.output
    missing = CliRunner().invoke(app, ["render", "--shape", "dgx-h100"])
    assert missing.exit_code == 2 and "--nvidiadriver" in missing.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {name: d}\n"
        "spec: {default: true, nodeSelector: {pool: a}}\n"
    )
    out = CliRunner().invoke(app, ["render", "--nvidiadriver", str(bad), "--shape", "dgx-h100"])
    assert out.exit_code == 2 and "spec.nodeSelector" in out.output


def test_clusterpolicy_driver_state_hands_over_with_orphaned_pods() -> None:
    from gpu_operator.render import render

    handed = render(policy({"driver": {"useNvidiaDriverCRD": True}}), facts("dgx-h100:1"))
    state = handed.state("state-driver")
    assert not state.enabled and state.orphan_pods
    assert state.objects == []  # the operator deletes the live driver DaemonSets, orphaning their pods
    assert handed.state("state-vgpu-manager").orphan_pods
    off = render(policy({"driver": {"enabled": False}}), facts("dgx-h100:1")).state("state-driver")
    assert not off.enabled and not off.orphan_pods


def test_long_names_keep_the_hash_and_upstream_defaults_apply() -> None:
    long = nvd(driverType="vgpu-host-manager")
    pool = node_pools(long, facts("dgx-h100:1").gpu_nodes)[0][0]
    pool = type(pool)(os_tag="x" * 80, node_selector={}, nodes=())
    name = daemonset_name(long, pool)
    assert len(name) == 63 and name.endswith("-" + safe_encode(str(fnv32a(UID))))
    pre = next(
        iter(
            daemonsets(
                render_nvidiadriver(nvd(usePrecompiled=True, version="1"), facts("dgx-h100:1"))
            ).values()
        )
    )
    assert ctr(pre, "nvidia-driver-ctr")["startupProbe"]["initialDelaySeconds"] == 5
    labelled = nvd(version="1", labels={"app": "x", "app.kubernetes.io/name": "y", "team": "ml"})
    ds = next(iter(daemonsets(render_nvidiadriver(labelled, facts("dgx-h100:1"))).values()))
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert (
        labels["team"] == "ml"
        and labels["app"] == ds["metadata"]["name"]
        and "app.kubernetes.io/name" not in labels
    )
    assert ctr(ds, "nvidia-driver-ctr")["startupProbe"]["initialDelaySeconds"] == 60


@pytest.mark.parametrize(("precompiled", "mounted"), [(True, True), (False, False)])
def test_precompiled_suse_pool_reads_the_hosts_lib_modules(precompiled: bool, mounted: bool) -> None:
    suse = (
        "dgx-h100:1,feature.node.kubernetes.io/system-os_release.ID=sl-micro,"
        "feature.node.kubernetes.io/system-os_release.VERSION_ID=6.1"
    )
    by_name = daemonsets(
        render_nvidiadriver(nvd(usePrecompiled=precompiled, version="570"), facts(suse, "host-driver:1"))
    )
    os_ids = sorted(
        d["spec"]["template"]["spec"]["nodeSelector"]["feature.node.kubernetes.io/system-os_release.ID"]
        for d in by_name.values()
    )
    assert os_ids == ["sl-micro", "ubuntu"]
    for ds in by_name.values():
        pod = ds["spec"]["template"]["spec"]
        volume = [v for v in pod["volumes"] if v["name"] == "lib-modules"]
        mounts = [m for m in ctr(ds, "nvidia-driver-ctr")["volumeMounts"] if m["name"] == "lib-modules"]
        on_suse = pod["nodeSelector"]["feature.node.kubernetes.io/system-os_release.ID"] == "sl-micro"
        if mounted and on_suse:  # only the SUSE pool: the ubuntu pool's DaemonSet has none
            assert volume == [
                {"name": "lib-modules", "hostPath": {"path": "/lib/modules", "type": "Directory"}}
            ]
            assert mounts == [{"name": "lib-modules", "mountPath": "/run/host/lib/modules", "readOnly": True}]
        else:
            assert (volume, mounts) == ([], [])
