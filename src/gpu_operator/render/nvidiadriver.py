"""NVIDIADriver -> driver DaemonSets, one per node pool, through the same driver state as ClusterPolicy.

There is one driver renderer: the NVIDIADriver's fields become the driver inputs of a ClusterPolicy
(`driver_policy`), the cluster facts are cut down to one pool's nodes, and the ClusterPolicy's
driver state (or vGPU manager state for `driverType: vgpu-host-manager`) renders that pool. What
is particular to NVIDIADriver is added afterwards: the pool's name and node selector, and names of
the shared objects (ServiceAccount, RBAC, startup-probe ConfigMap) that carry the CR's name.

Pools as upstream splits them: one per OS (`<ID><VERSION_ID>`, major only for rhel/rocky/ol), and
per OS + full kernel version when precompiled drivers are used.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.nvidiadriver import NVIDIADriver, NVIDIADriverSpec
from gpu_operator.render import guestnvlink
from gpu_operator.render.facts import MAJOR_ONLY_OS, ClusterFacts, NodeFacts
from gpu_operator.render.objects import Ctx
from gpu_operator.render.operand import Operand, render_operand
from gpu_operator.render.result import Manifest, RenderError, RenderResult, StateResult
from gpu_operator.render.states import driver as driver_state
from gpu_operator.render.states import vgpu_manager as vgpu_state
from gpu_operator.vocabulary import (
    DRIVER_OWNER,
    GPU_PRESENT,
    KERNEL_FULL,
    OS_ID,
    OS_VERSION_ID,
    OS_VERSION_MAJOR,
)

OWNER_LABEL = DRIVER_OWNER
NAME_LIMIT = 63
# k8s.io/apimachinery rand.SafeEncodeString's alphabet (no vowels, no look-alikes).
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def fnv32a(data: str) -> int:
    value = 0x811C9DC5
    for byte in data.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def safe_encode(text: str) -> str:
    return "".join(_SAFE_ALPHABET[ord(char) % len(_SAFE_ALPHABET)] for char in text)


def name_hash(key: str) -> str:
    """Upstream's object-name hash: FNV-32a of the key, in decimal, safe-encoded."""
    return safe_encode(str(fnv32a(key)))


def truncate(name: str) -> str:
    return name[:NAME_LIMIT].rstrip("-.")


@dataclass(frozen=True)
class Pool:
    """Nodes that share one driver DaemonSet: same OS (and same kernel when precompiled)."""

    os_tag: str
    node_selector: Mapping[str, str]
    nodes: tuple[str, ...]
    kernel: str | None = None

    @property
    def key(self) -> str:
        return f"{self.os_tag}/{self.kernel}" if self.kernel else self.os_tag


def selects(spec: NVIDIADriverSpec, labels: Mapping[str, str]) -> bool:
    """Whether the CR's nodeSelector picks a node (an empty selector picks every node)."""
    return all(labels.get(key) == value for key, value in (spec.nodeSelector or {}).items())


def _pool_selector(node: NodeFacts, kernel: str | None) -> dict[str, str]:
    os_id = node.labels.get(OS_ID, "")
    selector = {OS_ID: os_id}
    if os_id in MAJOR_ONLY_OS:
        selector[OS_VERSION_MAJOR] = (
            node.labels.get(OS_VERSION_MAJOR) or node.labels.get(OS_VERSION_ID, "").split(".")[0]
        )
    else:
        selector[OS_VERSION_ID] = node.labels.get(OS_VERSION_ID, "")
    if kernel:
        selector[KERNEL_FULL] = kernel
    return selector


def node_pools(nvd: NVIDIADriver, nodes: Collection[NodeFacts]) -> tuple[list[Pool], list[str]]:
    """The pools of the given nodes, and the names of nodes without OS labels (no pool possible)."""
    precompiled = bool(nvd.spec.usePrecompiled)
    grouped: dict[tuple[str, str], list[NodeFacts]] = {}
    unpooled: list[str] = []
    for node in sorted(nodes, key=lambda n: n.name):
        kernel = node.kernel if precompiled else ""
        if not node.os_tag or (precompiled and not kernel):
            unpooled.append(node.name)
            continue
        grouped.setdefault((node.os_tag, kernel), []).append(node)
    pools = [
        Pool(
            os_tag=os_tag,
            kernel=kernel or None,
            node_selector=_pool_selector(members[0], kernel or None),
            nodes=tuple(n.name for n in members),
        )
        for (os_tag, kernel), members in sorted(grouped.items())
    ]
    return pools, unpooled


def shared_name(nvd: NVIDIADriver) -> str:
    """ServiceAccount/RBAC/ConfigMap name of one NVIDIADriver (ours: upstream shares one set)."""
    return truncate(f"nvidia-{nvd.spec.driverType}-driver-{nvd.metadata.name}")


def _fit(prefix: str, digest: str, suffix: str = "") -> str:
    """`<prefix>-<digest><suffix>` in 63 characters: the prefix is cut, never the digest or the suffix."""
    return f"{prefix[: NAME_LIMIT - len(digest) - 1 - len(suffix)].rstrip('-.')}-{digest}{suffix}"


def daemonset_name(nvd: NVIDIADriver, pool: Pool, suffix: str = "") -> str:
    """`nvidia-<driverType>-driver-<osTag>-<hash>[<suffix>]`, hash of the CR's uid (+ `-<kernel>` if
    precompiled); past 63 characters the prefix is cut, never the hash or the suffix (the pool's
    VM guests that need NVLink off: `-guest-nvlink-off`, render/guestnvlink.py)."""
    key = nvd.metadata.uid or nvd.metadata.name
    if pool.kernel:
        key = f"{key}-{pool.kernel}"
    return _fit(f"nvidia-{nvd.spec.driverType}-driver-{pool.os_tag}", name_hash(key), suffix)


def guest_configmap_name(nvd: NVIDIADriver) -> str:
    """The kernel-module ConfigMap of this CR's VM guests that need NVLink off:
    `nvidia-<driverType>-driver-<name>-guest-nvlink-off`; past 63 characters the name is cut and the
    hash of the CR's name put before the suffix (CRs whose long names share a beginning stay apart)."""
    name, suffix = f"nvidia-{nvd.spec.driverType}-driver-{nvd.metadata.name}", guestnvlink.DAEMONSET_SUFFIX
    return (
        name + suffix
        if len(name) + len(suffix) <= NAME_LIMIT
        else _fit(name, name_hash(nvd.metadata.name), suffix)
    )


def image_reference(spec: NVIDIADriverSpec) -> str:
    """`[repository/]image[:version|@sha256:...]`: image alone may be a full reference."""
    path = f"{spec.repository}/{spec.image}" if spec.repository else spec.image
    if not spec.version:
        return path
    return f"{path}{'@' if spec.version.startswith('sha256:') else ':'}{spec.version}"


def _image_fields(spec: NVIDIADriverSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"image": image_reference(spec)}
    if spec.imagePullPolicy:
        out["imagePullPolicy"] = spec.imagePullPolicy
    if spec.imagePullSecrets:
        out["imagePullSecrets"] = list(spec.imagePullSecrets)
    return out


def _driver_fields(spec: NVIDIADriverSpec) -> dict[str, Any]:
    """The NVIDIADriver's fields under the names ClusterPolicy's spec.driver gives them."""
    data = spec.dump()
    out: dict[str, Any] = {"enabled": True, **_image_fields(spec)}
    for key in (
        "usePrecompiled",
        "useOpenKernelModules",
        "kernelModuleType",
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
        "rdma",
        "manager",
        "resources",
        "args",
        "env",
        "hostNetwork",
        "secretEnv",
        "kernelModuleConfig",
        "certConfig",
    ):
        if key in data:
            out[key] = data[key]
    if spec.upgradePolicy:  # with its defaults: auto-upgrade is on unless the CR says otherwise
        out["upgradePolicy"] = spec.upgradePolicy.model_dump(mode="json", exclude_none=True)
    out["kernelModuleType"] = spec.kernelModuleType
    if spec.startupProbe is None:  # upstream's NVIDIADriver default: precompiled modules load fast
        out["startupProbe"] = {
            "initialDelaySeconds": 5 if spec.usePrecompiled else 60,
            "timeoutSeconds": 60,
            "periodSeconds": 10,
            "successThreshold": 1,
            "failureThreshold": 120,
        }
    if spec.repoConfig and spec.repoConfig.name:
        out["repoConfig"] = {"configMapName": spec.repoConfig.name}
    if spec.licensingConfig:
        licensing = spec.licensingConfig
        out["licensingConfig"] = {
            k: v
            for k, v in (
                ("secretName", licensing.secretName),
                ("configMapName", licensing.name),
                ("nlsEnabled", licensing.nlsEnabled),
            )
            if v is not None
        }
    if spec.virtualTopologyConfig and spec.virtualTopologyConfig.name:
        out["virtualTopology"] = {"config": spec.virtualTopologyConfig.name}
    return out


def driver_policy(nvd: NVIDIADriver, base: ClusterPolicy | None = None) -> ClusterPolicy:
    """A ClusterPolicy whose driver inputs are the NVIDIADriver's; the rest (host paths, validator
    image) is the cluster's ClusterPolicy when there is one, else the defaults."""
    spec = nvd.spec
    data = base.dump() if base else {"metadata": {"name": "nvidiadriver"}}
    cp = dict(data.get("spec") or {})
    cp["driver"] = _driver_fields(spec)
    if base and base.spec.driver.guestNVLink:  # ours, not in NVIDIA's NVIDIADriver: the ClusterPolicy's
        cp["driver"]["guestNVLink"] = base.spec.driver.guestNVLink
    for key in ("gds", "gdrcopy"):
        sidecar = getattr(spec, key)
        cp[key] = sidecar.dump() if sidecar else {"enabled": False}
    daemonsets: dict[str, Any] = {"updateStrategy": "OnDelete"}
    for key in ("labels", "annotations", "tolerations", "priorityClassName", "podSecurityContext"):
        value = getattr(spec, key)
        if value:
            daemonsets[key] = value
    if spec.labels:  # the pods stay selectable: `app` and `app.kubernetes.io/*` are ours
        daemonsets["labels"] = {
            k: v for k, v in spec.labels.items() if k != "app" and not k.startswith("app.kubernetes.io/")
        }
    cp["daemonsets"] = daemonsets
    if spec.driverType == "vgpu-host-manager":
        cp["vgpuManager"] = {
            "enabled": True,
            **_image_fields(spec),
            **({"driverManager": spec.manager.dump()} if spec.manager else {}),
            **({"kernelModuleConfig": spec.kernelModuleConfig.dump()} if spec.kernelModuleConfig else {}),
        }
    return ClusterPolicy.model_validate({**data, "spec": cp})


def check_nvidiadriver(nvd: NVIDIADriver) -> None:
    """The CRD's CEL rules and upstream's routing rule, for objects that bypassed the API server."""
    spec = nvd.spec
    if spec.default and spec.nodeSelector:
        raise RenderError(
            "spec.nodeSelector",
            "the default NVIDIADriver must not set nodeSelector: remove it, or set spec.default=false",
        )
    if OWNER_LABEL in (spec.nodeSelector or {}):
        raise RenderError(
            f"spec.nodeSelector.{OWNER_LABEL}",
            "the operator writes this label itself from the nodeSelector: select on other labels",
        )
    if not spec.image:
        raise RenderError("spec.image", "set the driver image (e.g. nvcr.io/nvidia/driver)")
    if spec.usePrecompiled and ((spec.gds and spec.gds.enabled) or (spec.gdrcopy and spec.gdrcopy.enabled)):
        raise RenderError(
            "spec.usePrecompiled",
            "precompiled drivers cannot be combined with gds.enabled or gdrcopy.enabled: turn one off",
        )


def _operand(nvd: NVIDIADriver) -> Operand:
    source = vgpu_state.OPERAND if nvd.spec.driverType == "vgpu-host-manager" else driver_state.OPERAND
    return dataclasses.replace(source, account=shared_name(nvd))


def _rename_configmap(objects: list[Manifest], old: str, new: str) -> None:
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == old:
            obj["metadata"]["name"] = new
        if obj["kind"] == "DaemonSet":
            for volume in obj["spec"]["template"]["spec"].get("volumes", []):
                if volume.get("configMap", {}).get("name") == old:
                    volume["configMap"]["name"] = new


def _pool_daemonset(
    ds: Manifest, nvd: NVIDIADriver, pool: Pool, guests: list[str] | None = None, inside: bool = False
) -> Manifest:
    """One pool's DaemonSet; with `guests`, the pool's VM guests that need NVLink off: the DaemonSet
    that stays off them, or (`inside`) theirs, named with guestnvlink's suffix."""
    name = daemonset_name(nvd, pool, guestnvlink.DAEMONSET_SUFFIX if inside else "")
    ds["metadata"]["name"] = name
    template = ds["spec"]["template"]
    for labels in (ds["metadata"]["labels"], template["metadata"]["labels"]):
        labels["app"] = name
    ds["spec"]["selector"] = {"matchLabels": {"app": name}}
    pod = template["spec"]
    pod["nodeSelector"] = {
        **pod.get("nodeSelector", {}),
        **(nvd.spec.nodeSelector or {}),
        GPU_PRESENT: "true",
        OWNER_LABEL: nvd.metadata.name,
        **pool.node_selector,
    }
    if nvd.spec.nodeAffinity:
        pod.setdefault("affinity", {})["nodeAffinity"] = copy.deepcopy(dict(nvd.spec.nodeAffinity))
        if guests:  # the CR's affinity replaced the split's: ANDed into the CR's terms again
            guestnvlink.restrict(pod, guests, inside)
    return ds


def _pool_objects(built: list[Manifest], nvd: NVIDIADriver, pool: Pool, ctx: Ctx) -> list[Manifest]:
    """The pool's DaemonSet, and when the driver state split the pool's VM guests off (the same rule
    and nodes as a ClusterPolicy's, render/guestnvlink.py), theirs."""
    split = [ds for ds in built if ds["metadata"]["name"].endswith(guestnvlink.DAEMONSET_SUFFIX)]
    main = [ds for ds in built if not ds["metadata"]["name"].endswith(guestnvlink.DAEMONSET_SUFFIX)]
    if len(main) != 1 or len(split) > 1:
        raise RenderError(
            "spec",
            f"pool {pool.key} rendered {len(built)} DaemonSets, expected one "
            "(and one for its VM guests that need NVLink off)",
        )
    guests = guestnvlink.guest_nodes(ctx.facts.gpu_nodes) if split else []
    return [_pool_daemonset(main[0], nvd, pool, guests)] + [
        _pool_daemonset(ds, nvd, pool, guests, inside=True) for ds in split
    ]


def _guest_configmap(operand: Operand, ctx: Ctx, nvd: NVIDIADriver) -> list[Manifest]:
    """The driver state's merged kernel-module ConfigMap of the VM guests, under this CR's name."""
    extras = operand.extras(ctx, operand.state) if operand.extras else []
    found = [o for o in extras if o["kind"] == "ConfigMap" and o["metadata"]["name"] == guestnvlink.CONFIGMAP]
    _rename_configmap(found, guestnvlink.CONFIGMAP, guest_configmap_name(nvd))
    return found


def pool_facts(facts: ClusterFacts, names: Collection[str]) -> ClusterFacts:
    wanted = set(names)
    return dataclasses.replace(facts, nodes=tuple(n for n in facts.nodes if n.name in wanted))


def render_nvidiadriver(
    nvd: NVIDIADriver,
    facts: ClusterFacts,
    base: ClusterPolicy | None = None,
    owned: Collection[str] | None = None,
) -> RenderResult:
    """The NVIDIADriver's objects: its shared objects, then one driver DaemonSet per pool.

    `owned` names the nodes the CR owns (the operator's routing); without it (offline rendering)
    the CR owns every GPU node its nodeSelector picks. States: `state-driver` holds the shared
    objects, then one `pool <osTag>[/<kernel>]` state per pool (its DaemonSet, and the nodes).
    """
    check_nvidiadriver(nvd)
    policy = driver_policy(nvd, base)
    operand = _operand(nvd)
    gpu = [
        n for n in facts.gpu_nodes if (n.name in owned if owned is not None else selects(nvd.spec, n.labels))
    ]
    pools, unpooled = node_pools(nvd, gpu)
    probe_cm = truncate(f"{shared_name(nvd)}-startup-probe")
    shared, _ = render_operand(operand, Ctx(policy, pool_facts(facts, [])))
    _rename_configmap(shared, driver_state.PROBE_CM, probe_cm)
    selector = (
        ", ".join(f"{k}={v}" for k, v in sorted((nvd.spec.nodeSelector or {}).items())) or "every GPU node"
    )
    reason = f"NVIDIADriver {nvd.metadata.name}: {len(gpu)} node(s) ({selector}), {len(pools)} pool(s)"
    states: list[StateResult] = []
    guest_cm: list[Manifest] = []
    for pool in pools:
        ctx = Ctx(policy, pool_facts(facts, pool.nodes))
        built = operand.daemonsets(operand, ctx) if operand.daemonsets else []
        if not built and operand.daemonset:
            objects, _ = render_operand(operand, ctx)
            built = [o for o in objects if o["kind"] == "DaemonSet"]
        _rename_configmap(built, driver_state.PROBE_CM, probe_cm)
        _rename_configmap(built, guestnvlink.CONFIGMAP, guest_configmap_name(nvd))
        objects = _pool_objects(built, nvd, pool, ctx)
        if len(objects) > 1 and not guest_cm:  # one per CR: its content is the CR's, not the pool's
            guest_cm = _guest_configmap(operand, ctx, nvd)
        states.append(StateResult(f"pool {pool.key}", True, f"nodes: {', '.join(pool.nodes)}", objects))
    states.insert(0, StateResult(operand.state, True, reason, [*shared, *guest_cm]))
    warnings = nvd.warnings()
    if unpooled:
        warnings.append(
            f"NVIDIADriver {nvd.metadata.name}: node(s) {', '.join(unpooled)} lack the NFD labels "
            f"{OS_ID} and {OS_VERSION_ID}"
            + (f" or {KERNEL_FULL}" if nvd.spec.usePrecompiled else "")
            + ": no driver pool for them until NFD labels them"
        )
    if not gpu:
        warnings.append(f"NVIDIADriver {nvd.metadata.name}: nodeSelector ({selector}) matches no GPU node")
    return RenderResult(states=states, warnings=warnings)


def pools_of(result: RenderResult) -> list[StateResult]:
    return [s for s in result.states if s.name.startswith("pool ")]
