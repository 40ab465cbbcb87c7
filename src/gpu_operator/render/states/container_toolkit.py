"""State 4, state-container-toolkit: installs nvidia-container-toolkit and configures the runtime."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from gpu_operator.render.distributions import (
    PENDING,
    STOCK,
    config_of,
    distribution_of,
    problem,
    user_names_paths,
)
from gpu_operator.render.facts import workload_config
from gpu_operator.render.objects import (
    Ctx,
    configmap_volume,
    container,
    env,
    env_field,
    hostpath,
    mount,
)
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, build_daemonset, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import (
    DRIVER_INSTALL_DIR,
    HOST_DEV_CHAR,
    HOST_ROOT,
    VALIDATIONS,
    configmap,
    validator_init,
    when_enabled,
)
from gpu_operator.render.transforms.runtime import toolkit_runtime
from gpu_operator.vocabulary import CONTAINER, RUNTIME_GROUP, VALIDATIONS_DIR

STATE = "state-container-toolkit"
NAME = "nvidia-container-toolkit"
ENTRYPOINT = "nvidia-container-toolkit-entrypoint"
SCRIPT = """#!/bin/sh
# Wait until the driver is validated, take its location from driver-ready, then install.
until [ -f /run/nvidia/validations/driver-ready ]; do echo waiting for the driver; sleep 5; done
set -a; . /run/nvidia/validations/driver-ready; set +a
# containerd >= 1.6.9 may restart while we write its config: give it a moment
sleep 5
exec nvidia-toolkit
"""


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        "nvidia-container-toolkit-ctr",
        command=["/bin/entrypoint.sh"],
        env_vars=[
            env("ROOT", "/usr/local/nvidia"),
            env("NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND", "management.nvidia.com/gpu"),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("TOOLKIT_PID_FILE", "/run/nvidia/toolkit/toolkit.pid"),
            env_field("NRI_NAMESPACE", "metadata.namespace"),
        ],
        mounts=[
            mount(
                "nvidia-container-toolkit-entrypoint",
                "/bin/entrypoint.sh",
                readonly=True,
                sub_path="entrypoint.sh",
            ),
            mount("toolkit-root", "/run/nvidia/toolkit"),
            mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="HostToContainer"),
            mount("toolkit-install-dir", "/usr/local/nvidia"),
            mount("driver-install-dir", "/driver-root", readonly=True, propagation="HostToContainer"),
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("cdi-root", "/var/run/cdi"),
        ],
        privileged=True,
    )
    driver = validator_init(
        "driver",
        mounts=[
            mount("driver-install-dir", "/run/nvidia/driver", propagation="HostToContainer"),
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("host-dev-char", "/host-dev-char"),
            mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="Bidirectional"),
        ],
    )
    return {
        "hostPID": True,
        "initContainers": [driver],
        "containers": [main],
        "volumes": [
            configmap_volume("nvidia-container-toolkit-entrypoint", ENTRYPOINT, 0o755),
            hostpath("toolkit-root", "/run/nvidia/toolkit", "DirectoryOrCreate"),
            VALIDATIONS,
            hostpath("toolkit-install-dir", "/usr/local/nvidia", "DirectoryOrCreate"),
            DRIVER_INSTALL_DIR,
            HOST_ROOT,
            HOST_DEV_CHAR,
            hostpath("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
        ],
    }


def _runtime(ds: dict[str, Any], ctx: Ctx) -> None:
    toolkit_runtime(ds["spec"]["template"]["spec"], ctx.spec, ctx.facts.runtime, ctx.facts.openshift)


def _group_runtime(ds: dict[str, Any], ctx: Ctx, group: str, config: str) -> None:
    toolkit_runtime(
        ds["spec"]["template"]["spec"],
        ctx.spec,
        ctx.facts.runtime,
        ctx.facts.openshift,
        distribution_of(group),
        config,
    )


def groups(ctx: Ctx) -> tuple[dict[str, list[str]], list[str]]:
    """GPU nodes by toolkit group, the cluster's own runtime's under STOCK's key (today's DaemonSet),
    and the nodes no DaemonSet may serve (an unrecognised runtime the user's toolkit.env does not name:
    docs/distributions.md). A node whose runtime is not reported yet (PENDING) is in neither."""
    stock = STOCK if ctx.facts.runtime == "containerd" else ctx.facts.runtime
    named = user_names_paths([(e.name, e.value or "") for e in ctx.spec.toolkit.env or []])
    out: dict[str, list[str]] = {STOCK: []}
    unserved: list[str] = []
    for node in ctx.facts.gpu_nodes:
        group = node.toolkit_group
        if group == PENDING:
            continue  # its runtime is not known yet: neither a group of its own nor unserved
        if group == stock or (distribution_of(group) is None and named):
            out[STOCK].append(node.name)
        elif distribution_of(group) is None:
            unserved.append(node.name)
        else:
            out.setdefault(group, []).append(node.name)
    return out, unserved


def unserved(ctx: Ctx) -> dict[str, str]:
    """Container-workload (or mixed) GPU nodes no toolkit DaemonSet serves, each with the message that names
    the node and the toolkit.env keys to set (the ClusterPolicy's status, a Warning Event on the node)."""
    if not ctx.spec.toolkit.on():
        return {}
    _, names = groups(ctx)
    nodes = {n.name: n for n in ctx.facts.gpu_nodes}
    spec = ctx.spec
    return {
        name: problem(
            name,
            nodes[name].distribution,
            nodes[name].runtime_version,
            nodes[name].probe_runtime.get("flavor", ""),
        )
        for name in names
        if workload_config(nodes[name].labels, spec.sandbox_on(), spec.default_workload()) == CONTAINER
        or (spec.sandbox_on() and nodes[name].mixed)
    }  # a mixed node runs the container stack too


def _affinity(ds: dict[str, Any], operator: str, values: list[str]) -> None:
    term = {"matchExpressions": [{"key": RUNTIME_GROUP, "operator": operator, "values": values}]}
    node = ds["spec"]["template"]["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [term]}


def _daemonsets(operand: Operand, ctx: Ctx) -> list[Manifest]:
    """Today's DaemonSet for the cluster's own runtime, and one per other distribution among the
    GPU nodes (`nvidia-container-toolkit-daemonset-<group>`, on nodes labelled RUNTIME_GROUP=<group>),
    each pointed at its distribution's paths; a stock cluster renders exactly one, unchanged."""
    assert operand.daemonset is not None
    members, unserved = groups(ctx)
    stock = build_daemonset(operand.daemonset, operand, ctx)
    others = sorted(set(members) - {STOCK})
    nodes = {n.name: n for n in ctx.facts.gpu_nodes}
    if others or unserved:
        excluded = others + sorted({nodes[n].toolkit_group for n in unserved})
        _affinity(stock, "NotIn", excluded)
    out = [stock]
    for group in others:
        first = nodes[members[group][0]]
        dist = distribution_of(group)
        assert dist is not None
        config = config_of(dist, first.runtime_version, first.probe_runtime)
        defn = dataclasses.replace(
            operand.daemonset,
            name=f"{operand.daemonset.name}-{group}",
            transforms=(functools.partial(_group_runtime, group=group, config=config),),
        )
        ds = build_daemonset(defn, operand, ctx)
        _affinity(ds, "In", [group])
        out.append(ds)
    return out


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    return [configmap(ENTRYPOINT, state, ctx, {"entrypoint.sh": SCRIPT})]


OPERAND = Operand(
    state=STATE,
    gate=when_enabled("toolkit"),
    account=NAME,
    # driver-validation lists the driver DaemonSets in its namespace
    role_rules=(rule([""], ["pods"], ["get", "list"]), rule(["apps"], ["daemonsets"], ["get", "list"])),
    extras=_extras,
    daemonset=DaemonSetDef(
        name="nvidia-container-toolkit-daemonset",
        deploy="container-toolkit",
        image=Image("toolkit", "CONTAINER_TOOLKIT_IMAGE"),
        pod=_pod,
        transforms=(_runtime,),
    ),
    daemonsets=_daemonsets,
)
