"""The take-over from NVIDIA's operator v26.7.0 (tests/integration/test_takeover.py) with the
simulator's real kubelet node as one of the GPU nodes: NVIDIA's recorded state is laid on the
cluster (tests/fixtures/nvidia-v26.7.0: its ClusterPolicy, the objects it owns, the first recorded
node's `nvidia.com/` labels and annotations on the real node, the other two on kwok nodes), the
DaemonSet controller starts the recorded DaemonSets' pods, which on the real node are real
containers, and only then our operator starts. With `driver.upgradePolicy.autoUpgrade: false` the
driver pod on the real node keeps its uid and its container (same container id, no restart)
while the other operands' pods are replaced by ours
(with the exceptions said at must_roll), every DaemonSet of NVIDIA's applied over (ours carry its
selectors). And back: with ours stopped and the ClusterPolicy kept, what NVIDIA's operator needs
to take the cluster again is there (docs/migrate.md, "Rolling back"): its selectors, the policy,
and the real node's driver pod still the same container.

What the real node can run (docs/simulator.md: NVIDIA's images cannot be pulled here) is mapped
as the other real-node tests map it, by importing an image under NVIDIA's name into the node's
containerd (as sim/realnode/pluginimage.py does for the device plugin), and by deploy labels
`false` for the operands it has no image for (as sim/realnode/realspec.py's node_labels does):

- `nvcr.io/nvidia/driver:595.91.07-ubuntu22.04` and `nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0`
  (the recorded driver DaemonSet's images): our image plus a layer with NVIDIA's two commands as
  stand-ins (`nvidia-driver`: runs until stopped, installs nothing, the node's host tree carries
  the driver; `driver-manager`: exits 0). NVIDIA's startup probe (its script wants
  /sys/module/nvidia/refcnt) never passes here, so that pod runs but is not Ready.
- `nvcr.io/nvidia/gpu-operator:v26.7.0` (NVIDIA's validator image: the recorded validator and the
  init containers of the recorded DaemonSets, and the image the recorded ClusterPolicy names for
  our validator and node-status exporter): our image under that name; it provides
  `nvidia-validator`, as NVIDIA's does.
- `nvcr.io/nvidia/k8s-device-plugin:v0.20.0`: the device plugin's stand-in image the node has.
- container toolkit, GFD, DCGM, DCGM exporter, MIG manager, MPS: no image, so their deploy labels
  are `false` on the real node (the fixture's are `true`); our operator keeps those values.

The ClusterPolicy is the recorded one with realspec.policy_spec's settings (the operands read the
real node's host tree, hostPaths.rootFS) and autoUpgrade false, as a user's values would set them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.sim.realnode import ociarchive
from gpu_operator.sim.realnode.nodeimage import image_archive
from gpu_operator.sim.realnode.realnode import RealNode
from gpu_operator.sim.realnode.realspec import node_labels, policy_spec
from gpu_operator.vocabulary import DEPLOY_PREFIX, UPGRADE_STATE, VALIDATIONS_DIR, deploy_label
from tests.integration.realnode_fixtures import IMAGE, REAL_NODE, SHAPE, _labelled
from tests.integration.test_takeover import applied_by_us, daemonsets, status_written_by_us
from tests.support import takeover
from tests.support.cleanup import delete_if_present
from tests.support.takeover import NVIDIA_SELECTORS, pods_by_owner
from tests.support.waiting import wait_for

DRIVER = "nvidia-driver-daemonset"
DRIVER_CTR = "nvidia-driver-ctr"
PLUGIN = "nvidia-device-plugin-daemonset"
VALIDATOR = "nvidia-operator-validator"
EXPORTER = "nvidia-node-status-exporter"
GFD = "gpu-feature-discovery"
NVIDIA_DRIVER = """#!/bin/sh
# gpu-operator tests: NVIDIA's driver container played by a stand-in. It installs nothing (the
# real node's host tree carries the driver); it runs until it is stopped, as the driver does.
trap 'exit 0' TERM INT
echo "stand-in for nvidia-driver $*: the driver is the host tree's"
while :; do sleep 1 & wait $!; done
"""
DRIVER_MANAGER = """#!/bin/sh
# gpu-operator tests: NVIDIA's k8s-driver-manager played by a stand-in: nothing to uninstall.
echo "stand-in for driver-manager $*: nothing to do"
"""
DEV_LOG = Path("/dev/log")  # NVIDIA's driver pod mounts it (hostPath, no type): containerd makes it


def recorded_images(daemonset: str) -> dict[str, str]:
    """A recorded DaemonSet's images: {container name: image}."""
    (found,) = [
        o
        for o in takeover.read("objects.yaml")
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == daemonset
    ]
    spec = found["spec"]["template"]["spec"]
    return {c["name"]: c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]}


def map_nvidia_images(node: RealNode, workdir: Path) -> list[str]:
    """NVIDIA's image names the real node runs, imported into its containerd; returns them."""
    images = recorded_images(DRIVER)
    driver, manager = images[DRIVER_CTR], images["k8s-driver-manager"]
    archive = ociarchive.extend(
        image_archive(build=False),
        workdir / "nvidia-driver-stand-in.docker.tar",
        driver,
        {
            "/usr/local/bin/nvidia-driver": NVIDIA_DRIVER.encode(),
            "/usr/local/bin/driver-manager": DRIVER_MANAGER.encode(),
        },
        "gpu-operator tests: NVIDIA's driver and driver manager played by stand-ins",
    )
    node.containerd.import_image(archive)
    node.containerd.ctr("images", "tag", "--force", driver, manager)
    validator = recorded_images(VALIDATOR)[VALIDATOR]
    node.containerd.ctr("images", "tag", "--force", IMAGE, validator)
    return [driver, manager, validator]


def real_node_deploy_labels() -> dict[str, str]:
    """The real node's deploy labels over the recorded ones: `false` for every operand it has no
    image for (realspec.node_labels' rule), the driver's kept as recorded (it is mapped here)."""
    return {
        key: value
        for key, value in node_labels(SHAPE).items()
        if key.startswith(DEPLOY_PREFIX) and value == "false" and key != deploy_label("driver")
    }


@pytest.fixture
def real_takeover_node(real_node: RealNode, tmp_path: Path) -> Iterator[RealNode]:
    """The real node as a GPU node of SHAPE with NVIDIA's images mapped, for one test; afterwards
    its GPU labels and annotations, the mapped names and a /dev/log containerd made are gone."""
    assert real_node.host_root is not None
    for stale in (real_node.host_root / VALIDATIONS_DIR.lstrip("/")).glob("*"):
        stale.unlink()
    had_dev_log = os.path.lexists(DEV_LOG)
    mapped = map_nvidia_images(real_node, tmp_path)
    try:
        yield from _labelled(real_node, SHAPE)
    finally:
        for ref in mapped:
            real_node.containerd.ctr("images", "rm", ref)
        if not had_dev_log and DEV_LOG.is_dir() and not any(DEV_LOG.iterdir()):
            DEV_LOG.rmdir()


def pods_on_node(kube: Client, namespace: str, node: str) -> dict[str, Pod]:
    """DaemonSet name -> its live pod on `node`."""
    out = {}
    for pod in kube.list(Pod, namespace=namespace, fields={"spec.nodeName": node}):
        if pod.metadata.deletionTimestamp:
            continue
        for ref in pod.metadata.ownerReferences or []:
            if ref.kind == "DaemonSet" and ref.controller:
                out[ref.name] = pod
    return out


def driver_container(pod: Pod) -> dict[str, Any]:
    """The pod's uid and its driver container's id, restart count and state (status fields)."""
    found = [c for c in pod.status.containerStatuses or [] if c.name == DRIVER_CTR]
    status = found[0] if found else None
    return {
        "uid": pod.metadata.uid,
        "containerID": status.containerID if status else None,
        "restartCount": status.restartCount if status else None,
        "running": bool(status and status.state and status.state.running),
    }


def real_driver(kube: Client, namespace: str) -> dict[str, Any] | None:
    """driver_container of the real node's driver pod, None while it has none."""
    pod = pods_on_node(kube, namespace, REAL_NODE).get(DRIVER)
    return driver_container(pod) if pod is not None else None


def really_started(pod: Pod) -> bool:
    """Some container of the pod (init or main) was created by the real node's runtime."""
    statuses = [*(pod.status.initContainerStatuses or []), *(pod.status.containerStatuses or [])]
    return any(s.containerID for s in statuses)


def ready(pod: Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def pod_lines(kube: Client, namespace: str) -> str:
    """What a failed wait shows: each pod's node, phase and its containers' states (with the last
    termination message), and each DaemonSet's rollout."""
    lines = []
    for pod in kube.list(Pod, namespace=namespace):
        states = []
        for s in [*(pod.status.initContainerStatuses or []), *(pod.status.containerStatuses or [])]:
            state = {k: v for k, v in (s.state.to_dict() if s.state else {}).items() if v}
            last = (
                (s.lastState.terminated.message or "")[-400:]
                if s.lastState and s.lastState.terminated
                else ""
            )
            states.append(f"{s.name}:{state} last={last!r}")
        lines.append(
            f"{pod.metadata.name} {pod.spec.nodeName} {pod.status.phase} ready={ready(pod)} {states}"
        )
    for name, ds in daemonsets(kube, namespace).items():
        lines.append(
            f"ds {name} gen={ds.metadata.generation} status={ds.status.to_dict() if ds.status else None}"
        )
    return "\n".join(lines)


def test_takeover_with_auto_upgrade_off_keeps_the_real_nodes_driver_container_running(
    kube: Client,
    real_takeover_node: RealNode,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    operator_namespace: str,
) -> None:
    node, ns = real_takeover_node, operator_namespace
    assert node.host_root is not None
    recorded = takeover.recorded_nodes()
    nodes = [REAL_NODE, *fake_nodes(*[f"{r['shape']}:1" for r in recorded[1:]])]
    spec = policy_spec(node.host_root, {"driver": {"upgradePolicy": {"autoUpgrade": False}}})
    loaded = takeover.load(kube, ns, nodes, spec=spec, labels={REAL_NODE: real_node_deploy_labels()})
    recorded_sets, policy_uid = loaded.named("DaemonSet"), loaded.policy_uid
    try:

        def not_started() -> dict[str, Any]:
            """NVIDIA's pods not yet Ready on the kwok nodes, or on the real node not yet created
            by its runtime, or its driver container not running."""
            on_real = pods_on_node(kube, ns, REAL_NODE)
            left: dict[str, Any] = {n: p.status.phase for n, p in on_real.items() if not really_started(p)}
            if DRIVER not in on_real or not driver_container(on_real[DRIVER])["running"]:
                left[DRIVER] = "its container not running on the real node"
            kwok = [
                p.metadata.name
                for p in kube.list(Pod, namespace=ns)
                if p.spec.nodeName != REAL_NODE and not ready(p)
            ]
            return {**left, **({"kwok not ready": kwok} if kwok else {})}

        wait_for(
            "NVIDIA's pods started, the real node's driver container running",
            not_started,
            until=lambda left: not left,
            timeout=240,
            context=lambda: pod_lines(kube, ns),
        )
        before_pods, before_sets = pods_by_owner(kube, ns), daemonsets(kube, ns)
        before_real = pods_on_node(kube, ns, REAL_NODE)
        # What the real node's labels select: the driver, the device plugin and the validator.
        assert set(before_real) == {DRIVER, PLUGIN, VALIDATOR}
        driver_before = driver_container(before_real[DRIVER])
        assert driver_before["restartCount"] == 0 and driver_before["containerID"], driver_before
        assert len(before_pods[DRIVER]) == len(nodes)

        operator = start_operator()
        context = lambda: f"{pod_lines(kube, ns)}\n{operator.log_text()[-3000:]}"  # noqa: E731
        wait_for(
            "the status written by our operator",
            lambda: dict(kube.get(ClusterPolicyResource, "cluster-policy")),
            until=status_written_by_us,
            timeout=120,
            context=context,
        )

        # NVIDIA's pods that must be replaced: every operand's but the driver's (GFD's and the
        # validator's, whose selectors carry app.kubernetes.io/part-of, too); of the validator and the device plugin the real node's. Our validator there waits for
        # the toolkit, which the real node does not run here, so it is never Ready and the
        # DaemonSet controller (maxUnavailable 1) replaces no other validator pod, nor the device
        # plugin pods that wait for its toolkit-ready (the kwok-only tests see those replaced).
        held = (PLUGIN, VALIDATOR)
        must_roll = {
            n: {uid for uid, on in uids.items() if n not in held or on == REAL_NODE}
            for n, uids in before_pods.items()
            if n != DRIVER
        }
        assert {GFD, VALIDATOR} <= set(must_roll)

        def not_rolled() -> dict[str, list[str]]:
            now = pods_by_owner(kube, ns)
            kept = {n: set(now.get(n, {})) & uids for n, uids in must_roll.items()}
            return {n: sorted(uids) for n, uids in kept.items() if uids}

        wait_for(
            "every other operand's NVIDIA pods replaced by ours, the real node's too",
            not_rolled,
            until=lambda left: not left,
            timeout=300,
            interval=2,
            context=context,
        )
        exporter = wait_for(
            "our node-status exporter Ready on the real node",
            lambda: pods_on_node(kube, ns, REAL_NODE).get(EXPORTER),
            until=lambda pod: pod is not None and ready(pod) and really_started(pod),
            timeout=120,
            context=context,
        )
        assert exporter is not None
        driver_set = daemonsets(kube, ns)[DRIVER]
        assert applied_by_us(driver_set) and driver_set.spec.updateStrategy.type == "OnDelete"
        # The device plugin on the real node: NVIDIA's pod replaced by our DaemonSet's.
        plugin = wait_for(
            "our device plugin pod on the real node",
            lambda: pods_on_node(kube, ns, REAL_NODE).get(PLUGIN),
            until=lambda pod: (
                pod is not None
                and pod.metadata.uid != before_real[PLUGIN].metadata.uid
                and really_started(pod)
            ),
            timeout=90,
            context=context,
        )
        assert plugin is not None
        # The driver, once the other operands on the real node are ours and again once the upgrade
        # controller has been through every node (NVIDIA's upgrade-state labels gone): the same
        # pod, the same container, never restarted, still running.
        assert real_driver(kube, ns) == driver_before
        wait_for(
            "NVIDIA's upgrade-state labels taken off (auto-upgrade off)",
            lambda: [n for n in nodes if UPGRADE_STATE in (kube.get(Node, n).metadata.labels or {})],
            until=lambda left: not left,
            timeout=60,
            context=context,
        )
        assert real_driver(kube, ns) == driver_before
        assert pods_by_owner(kube, ns)[DRIVER] == before_pods[DRIVER]
        assert applied_by_us(daemonsets(kube, ns)[PLUGIN])
        # Every DaemonSet of NVIDIA's was applied over, none deleted and created again.
        after_sets = daemonsets(kube, ns)
        recreated = [n for n, s in before_sets.items() if after_sets[n].metadata.uid != s.metadata.uid]
        assert not recreated, f"deleted and created again: {recreated}"

        # And back: ours stops with the ClusterPolicy kept. NVIDIA's operator updates DaemonSets
        # (a selector cannot change): each has NVIDIA's recorded selector; the real node's driver
        # pod is still the same container, running.
        operator.stop()
        for name, ds in daemonsets(kube, ns).items():  # (the recorded ones and ours it lacked)
            nvidias = recorded_sets.get(name, {}).get("spec", {}).get("selector")
            assert ds.spec.selector.to_dict() == (nvidias or {"matchLabels": NVIDIA_SELECTORS[name]}), name
        assert kube.get(ClusterPolicyResource, "cluster-policy")["metadata"]["uid"] == policy_uid
        assert real_driver(kube, ns) == driver_before
    finally:
        delete_if_present(kube, ClusterPolicyResource, "cluster-policy")
        wait_for(
            "the real node's operand pods gone",
            lambda: pods_on_node(kube, ns, REAL_NODE),
            until=lambda left: not left,
            timeout=120,
        )
