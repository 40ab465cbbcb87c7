"""Runtimes by distribution: detection per node, one toolkit DaemonSet per distribution, the user's
toolkit.env over what is detected, and nodes whose runtime is not recognised (docs/distributions.md)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.render import render
from gpu_operator.render.distributions import HINT_KEYS, PENDING, UNRECOGNISED, detect, toolkit_group
from gpu_operator.render.facts import ClusterFacts, NodeFacts
from gpu_operator.render.objects import Ctx
from gpu_operator.render.states.container_toolkit import STATE, unserved
from gpu_operator.vocabulary import GPU_PRESENT, RUNTIME_GROUP
from tests.unit.render.renderkit import IMAGES, ctr, env_of, facts, policy, run

TOOLKIT = "nvidia-container-toolkit-daemonset"


@pytest.mark.parametrize(
    ("runtime", "kubelet", "probe", "labels", "expected"),
    [
        ("containerd://1.7.27", "v1.31.1", {}, {}, "containerd"),
        ("containerd://1.7.22-k3s1", "v1.31.1+k3s1", {}, {}, "k3s"),
        ("containerd://1.7.22-k3s1", "", {}, {}, "k3s"),  # k3s' containerd alone
        ("containerd://2.0.5-k3s1", "v1.32.5+rke2r1", {}, {}, "rke2"),  # RKE2 ships k3s' containerd
        ("containerd://1.7.24", "v1.31.3+k0s", {}, {}, "k0s"),
        ("containerd://1.6.28", "v1.31.3", {}, {"microk8s.io/cluster": "true"}, "microk8s"),
        ("cri-o://1.31.3", "v1.31.3", {}, {}, "crio"),
        ("docker://27.1.1", "v1.23.0", {}, {}, "docker"),
        ("containerd://1.6.28", "v1.31.3", {"flavor": "microk8s"}, {}, "microk8s"),  # the host's files
        ("containerd://1.7.22-k3s1", "v1.31.1+k3s1", {"flavor": "containerd"}, {}, "containerd"),  # files win
        ("containerd://1.7.27", "", {"flavor": "talos"}, {}, "talos"),
        (
            "containerd://1.7.27",
            "v1.31.3",
            {"flavor": "none"},
            {},
            UNRECOGNISED,
        ),  # the probe found none we know
        ("frakti://0.3", "v1.31.3", {}, {}, UNRECOGNISED),
        ("", "", {}, {}, PENDING),  # the kubelet has not reported its runtime yet
        ("", "v1.31.3+k3s1", {}, {}, PENDING),
        ("", "", {"flavor": "k3s"}, {}, "k3s"),  # the host's files answer before nodeInfo does
    ],
)
def test_detect(
    runtime: str, kubelet: str, probe: dict[str, str], labels: dict[str, str], expected: str
) -> None:
    assert detect(runtime, kubelet, probe, labels) == expected


def test_containerd2_groups_apart() -> None:
    assert toolkit_group("containerd://2.0.5-k3s1", "v1.32.5+rke2r1", {}) == "rke2-v3"
    assert toolkit_group("containerd://1.7.23-k3s2", "v1.31.4+k3s1", {}) == "k3s"
    # the template the probe found on the host decides
    found = {"flavor": "k3s", "template": "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"}
    assert toolkit_group("containerd://1.7.23-k3s2", "", found) == "k3s-v3"


def toolkits(result: Any) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in result.state(STATE).objects if o["kind"] == "DaemonSet"}


def host_paths(ds: dict[str, Any]) -> dict[str, str]:
    return {
        v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v
    }


def selected(ds: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = ds["spec"]["template"]["spec"].get("affinity", {}).get("nodeAffinity", {})
    terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return [e for t in terms for e in t["matchExpressions"]]


def test_stock_cluster_keeps_one_daemonset_without_affinity() -> None:
    found = toolkits(run({}, "a10:2"))
    assert list(found) == [TOOLKIT]
    assert selected(found[TOOLKIT]) == []


def test_k3s_nodes_get_their_own_daemonset_pointed_at_k3s() -> None:
    found = toolkits(run({}, "a10:1", "k3s:2"))
    assert sorted(found) == [TOOLKIT, f"{TOOLKIT}-k3s"]
    assert selected(found[TOOLKIT]) == [{"key": RUNTIME_GROUP, "operator": "NotIn", "values": ["k3s"]}]
    k3s = found[f"{TOOLKIT}-k3s"]
    assert selected(k3s) == [{"key": RUNTIME_GROUP, "operator": "In", "values": ["k3s"]}]
    env = env_of(ctr(k3s, "nvidia-container-toolkit-ctr"))
    assert env["CONTAINERD_CONFIG"] == "/runtime/config-dir/config.toml.tmpl"
    assert env["RUNTIME_CONFIG_SOURCE"] == "file=/host/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    assert env["RUNTIME_DROP_IN_CONFIG"] == ""
    assert env["CONTAINERD_SOCKET"] == "/runtime/sock-dir/containerd.sock"
    assert host_paths(k3s)["containerd-config"] == "/var/lib/rancher/k3s/agent/etc/containerd"
    assert host_paths(k3s)["containerd-socket"] == "/run/k3s/containerd"
    assert "containerd-drop-in-config" not in host_paths(k3s)


@pytest.mark.parametrize(
    ("shape", "group", "config_dir", "config", "socket_dir"),
    [
        (
            "rke2",
            "rke2-v3",
            "/var/lib/rancher/rke2/agent/etc/containerd",
            "config-v3.toml.tmpl",
            "/run/k3s/containerd",
        ),
        (
            "microk8s",
            "microk8s",
            "/var/snap/microk8s/current/args",
            "containerd-template.toml",
            "/var/snap/microk8s/common/run",
        ),
        ("k0s", "k0s", "/etc/k0s/containerd.d", "nvidia.toml", "/run/k0s"),
    ],
)
def test_each_distribution(shape: str, group: str, config_dir: str, config: str, socket_dir: str) -> None:
    ds = toolkits(run({}, f"{shape}:1"))[f"{TOOLKIT}-{group}"]
    assert host_paths(ds)["containerd-config"] == config_dir
    assert host_paths(ds)["containerd-socket"] == socket_dir
    assert (
        env_of(ctr(ds, "nvidia-container-toolkit-ctr"))["RUNTIME_CONFIG"] == f"/runtime/config-dir/{config}"
    )


def test_crio_cluster_is_upstreams_crio() -> None:
    found = toolkits(run({}, "crio:1"))
    assert list(found) == [TOOLKIT]
    assert env_of(ctr(found[TOOLKIT], "nvidia-container-toolkit-ctr"))["RUNTIME"] == "crio"


def test_users_env_wins() -> None:
    spec = {
        "toolkit": {
            "env": [
                {"name": "CONTAINERD_CONFIG", "value": "/etc/k3s-custom/config.toml"},
                {"name": "RUNTIME_CONFIG_SOURCE", "value": "command"},
            ]
        }
    }
    ds = toolkits(run(spec, "k3s:1"))[f"{TOOLKIT}-k3s"]
    env = env_of(ctr(ds, "nvidia-container-toolkit-ctr"))
    assert env["CONTAINERD_CONFIG"] == "/runtime/config-dir/config.toml"
    assert env["RUNTIME_CONFIG_SOURCE"] == "command"
    assert host_paths(ds)["containerd-config"] == "/etc/k3s-custom"
    assert host_paths(ds)["containerd-socket"] == "/run/k3s/containerd"  # not named: detected


GPU = {GPU_PRESENT: "true"}


def odd_cluster(spec: dict[str, Any]) -> tuple[Any, Ctx]:
    nodes = [
        NodeFacts("gpu-a", GPU, runtime_version="containerd://1.7.27"),
        NodeFacts("gpu-odd", GPU, runtime_version="frakti://0.3"),
    ]
    cluster = ClusterFacts.of(nodes, operator_env=IMAGES)
    return render(policy(spec), cluster), Ctx(policy(spec), cluster)


def test_an_unrecognised_runtime_gets_no_toolkit_and_a_message() -> None:
    result, ctx = odd_cluster({})
    found = toolkits(result)
    assert list(found) == [TOOLKIT]
    assert selected(found[TOOLKIT]) == [{"key": RUNTIME_GROUP, "operator": "NotIn", "values": [UNRECOGNISED]}]
    messages = unserved(ctx)
    assert list(messages) == ["gpu-odd"]
    assert messages["gpu-odd"] == (
        "node gpu-odd: no container toolkit runs there: its container runtime (frakti://0.3) is not one the "
        "operator recognises (containerd of stock, k3s, RKE2, MicroK8s or k0s; CRI-O; Docker); name its runtime "
        f"in spec.toolkit.env ({', '.join(HINT_KEYS)}) or label it nvidia.com/gpu.deploy.container-toolkit=false "
        "(docs/distributions.md)"
    )


def test_an_unrecognised_runtime_the_user_names_gets_the_stock_daemonset() -> None:
    spec = {
        "toolkit": {
            "env": [
                {"name": "CONTAINERD_CONFIG", "value": "/opt/ctr/config.toml"},
                {"name": "CONTAINERD_SOCKET", "value": "/opt/ctr/ctr.sock"},
            ]
        }
    }
    result, ctx = odd_cluster(spec)
    assert selected(toolkits(result)[TOOLKIT]) == []
    assert unserved(ctx) == {}


def test_no_message_where_the_toolkit_does_not_run() -> None:
    assert unserved(odd_cluster({"toolkit": {"enabled": False}})[1]) == {}
    sandbox = {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"}}
    assert unserved(odd_cluster(sandbox)[1]) == {}


def test_a_mixed_node_runs_the_container_stack_and_is_named() -> None:
    sandbox = policy({"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"}})
    mixed = NodeFacts("gpu-mixed", GPU, runtime_version="frakti://0.3", mixed=True)
    assert list(unserved(Ctx(sandbox, ClusterFacts.of([mixed], operator_env=IMAGES)))) == ["gpu-mixed"]


def test_probe_facts_reach_the_node_facts() -> None:
    node = {
        "metadata": {
            "name": "n",
            "labels": GPU,
            "annotations": {
                "nvidia.com/gpu.probe.facts": '{"driverSource":"none","gpus":[],"runtime":{"flavor":"microk8s",'
                '"name":"containerd"}}'
            },
        },
        "status": {
            "nodeInfo": {"containerRuntimeVersion": "containerd://1.6.28", "kubeletVersion": "v1.31.3"}
        },
    }
    assert NodeFacts.of(node).distribution == "microk8s"
    assert facts("a10:1").nodes[0].distribution == "containerd"


def test_a_runtime_not_reported_yet_is_not_blamed_and_is_decided_when_it_appears() -> None:
    """containerRuntimeVersion empty: no message, no NotIn for it; once reported, the usual rules."""

    def cluster(runtime: str) -> tuple[Any, Ctx]:
        nodes = [
            NodeFacts("gpu-a", GPU, runtime_version="containerd://1.7.27"),
            NodeFacts("gpu-new", GPU, runtime_version=runtime),
        ]
        facts_ = ClusterFacts.of(nodes, operator_env=IMAGES)
        return render(policy({}), facts_), Ctx(policy({}), facts_)

    result, ctx = cluster("")
    assert unserved(ctx) == {}
    assert list(toolkits(result)) == [TOOLKIT] and selected(toolkits(result)[TOOLKIT]) == []
    assert list(unserved(cluster("frakti://0.3")[1])) == ["gpu-new"]
    assert list(toolkits(cluster("containerd://1.7.22-k3s1")[0])) == [TOOLKIT, f"{TOOLKIT}-k3s"]
