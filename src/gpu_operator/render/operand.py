"""The one generic operand renderer: a small declarative definition per state -> Kubernetes objects.

A state module declares only what is particular to it (when it is enabled, its node-label gate,
its pod, its extra objects); this module does everything common: ServiceAccount and RBAC,
the DaemonSet skeleton, images, pull settings, resources/args/env, DaemonSet-wide settings,
validation init containers, GPU access and ownership labels.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.common import ComponentFields
from gpu_operator.render.objects import Ctx, obj, ownership
from gpu_operator.render.result import Manifest
from gpu_operator.render.transforms.cdi import gpu_access
from gpu_operator.render.transforms.component import apply_component, apply_image, pull_secrets
from gpu_operator.render.transforms.daemonset import common_config, driver_install_dir, host_root
from gpu_operator.render.transforms.hardening import harden
from gpu_operator.render.transforms.image import image_path, pull_policy
from gpu_operator.vocabulary import PART_OF, deploy_label

Gate = Callable[[Ctx], tuple[bool, str]]
PodBuilder = Callable[[Ctx, str], dict[str, Any]]
Transform = Callable[[dict[str, Any], Ctx], None]
Extras = Callable[[Ctx, str], list[Manifest]]
RBAC = "rbac.authorization.k8s.io/v1"


def rule(
    groups: list[str],
    resources: list[str],
    verbs: list[str],
    names: list[str] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"apiGroups": groups, "resources": resources, "verbs": verbs}
    if names:
        out["resourceNames"] = names
    return out


@dataclass(frozen=True)
class Image:
    """Where an operand's image comes from: `spec.<field>` and the operator env var fallback."""

    field: str
    env: str

    def fields(self, ctx: Ctx) -> ComponentFields:
        value = getattr(ctx.spec, self.field)
        assert isinstance(value, ComponentFields)
        return value

    def resolve(self, ctx: Ctx) -> str:
        # a version, repository or image given alone replaces that part of the env var's image
        return image_path(
            self.fields(ctx), self.env, dict(ctx.facts.operator_env), f"spec.{self.field}", partial=True
        )


VALIDATOR = Image("validator", "VALIDATOR_IMAGE")


@dataclass(frozen=True)
class OwnImage(Image):
    """Our image (the validator's image fields: the chart and the operator resolve them to ours) for an
    operand whose upstream image runs a program we replace; pull policy, pull secrets, env, resources
    and args still come from `spec.<field>`."""

    def resolve(self, ctx: Ctx) -> str:
        return VALIDATOR.resolve(ctx)


def nvidia_selector(name: str, key: str = "app", part_of: str | None = None) -> dict[str, str]:
    """A DaemonSet selector as NVIDIA's assets write it: `<key>: <name>`, and its part-of label."""
    return {key: name, **({PART_OF: part_of} if part_of else {})}


@dataclass(frozen=True)
class DaemonSetDef:
    name: str
    deploy: str  # node label gate: nvidia.com/gpu.deploy.<deploy>=true
    image: Image
    pod: PodBuilder
    gpu_access: bool = False  # runtimeClassName / NRI annotations
    transforms: tuple[Transform, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    on_delete: bool = False
    # The DaemonSet's selector where NVIDIA's is not {app: <name>} (its assets' selectors, v26.7.0):
    # a selector cannot change, so with NVIDIA's ours is applied over its DaemonSet at a take-over,
    # and its over ours at a roll-back, without deleting either (docs/migrate.md). Pods carry these
    # labels and `app: <name>` (what our own code finds operand pods by).
    selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Operand:
    state: str
    gate: Gate
    account: str | None = None  # ServiceAccount and RBAC object name
    role_rules: tuple[dict[str, Any], ...] = ()
    cluster_rules: tuple[dict[str, Any], ...] = ()
    daemonset: DaemonSetDef | None = None
    extras: Extras | None = None  # ConfigMaps, Services, ServiceMonitors, RuntimeClasses
    # Several DaemonSets (driver variants); defaults to the single `daemonset`.
    daemonsets: Callable[[Operand, Ctx], list[Manifest]] | None = None
    # When disabled: delete the DaemonSets with their pods orphaned (not killed)?
    orphan_pods: Callable[[Ctx], bool] | None = None


def grant(
    kind: str, name: str, state: str, ns: str, rules: list[dict[str, Any]], account: str
) -> list[Manifest]:
    """A Role (kind "Role", in `ns`) or ClusterRole with `rules`, bound to ServiceAccount `account`."""
    scope = ns if kind == "Role" else None
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": ns}]
    return [
        obj(RBAC, kind, name, state, scope, rules=rules),
        obj(
            RBAC,
            f"{kind}Binding",
            name,
            state,
            scope,
            subjects=subject,
            roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        ),
    ]


def scc(name: str, state: str, users: list[str], *, host_network: bool = True) -> Manifest:
    """An OpenShift SecurityContextConstraints letting `users` run privileged pods with host paths."""
    return obj(
        "security.openshift.io/v1",
        "SecurityContextConstraints",
        name,
        state,
        None,
        allowPrivilegedContainer=True,
        allowHostDirVolumePlugin=True,
        allowHostIPC=False,
        allowHostNetwork=host_network,
        allowHostPID=True,
        allowHostPorts=host_network,
        readOnlyRootFilesystem=False,
        runAsUser={"type": "RunAsAny"},
        seLinuxContext={"type": "RunAsAny"},
        fsGroup={"type": "RunAsAny"},
        supplementalGroups={"type": "RunAsAny"},
        volumes=["configMap", "emptyDir", "hostPath", "projected", "secret", "downwardAPI"],
        users=users,
    )


def rbac(operand: Operand, ctx: Ctx) -> list[Manifest]:
    """ServiceAccount, Role/RoleBinding, ClusterRole/ClusterRoleBinding (and an SCC on OpenShift)."""
    name, state, ns = operand.account, operand.state, ctx.ns
    if not name:
        return []
    out = [obj("v1", "ServiceAccount", name, state, ns)]
    role_rules = list(operand.role_rules)
    if ctx.facts.openshift:
        role_rules.append(rule(["security.openshift.io"], ["securitycontextconstraints"], ["use"], [name]))
    if role_rules:
        out += grant("Role", name, state, ns, role_rules, name)
    if operand.cluster_rules:
        out += grant("ClusterRole", name, state, ns, list(operand.cluster_rules), name)
    if ctx.facts.openshift:
        out.append(scc(name, state, [f"system:serviceaccount:{ns}:{name}"]))
    return out


def _wire_validation_inits(pod: dict[str, Any], ctx: Ctx) -> None:
    """Every `*-validation` init container runs the validator image."""
    inits = [c for c in pod.get("initContainers", []) if c["name"].endswith("-validation")]
    if not inits:
        return
    image = VALIDATOR.resolve(ctx)
    fields = ctx.spec.validator
    for ctr in inits:
        ctr["image"] = image
        ctr["imagePullPolicy"] = pull_policy(fields.imagePullPolicy)
    pull_secrets(pod, fields.imagePullSecrets)


def fresh_copy(tree: dict[str, Any]) -> dict[str, Any]:
    """A copy of a tree of plain data (dicts, lists, strings, numbers) sharing nothing with it, as
    copy.deepcopy makes (shared parts stay shared within the copy), by a pickle round trip in memory:
    ~6x faster than copy.deepcopy, which was a quarter of a render's time at 1,000 nodes
    (bench/README.md). Only our own data goes through it, never input from outside."""
    copied: dict[str, Any] = pickle.loads(pickle.dumps(tree, pickle.HIGHEST_PROTOCOL))
    return copied


def build_daemonset(defn: DaemonSetDef, operand: Operand, ctx: Ctx) -> Manifest:
    """The DaemonSet of one definition with every common transform applied."""
    image = defn.image.resolve(ctx)
    # A copy: state modules build pods from shared constants (volumes, mounts), and the
    # transforms below change the pod in place; without it one policy's hostPaths leaked into
    # every later render in the same process.
    pod = fresh_copy(defn.pod(ctx, image))
    selector = dict(defn.selector) or {"app": defn.name}
    labels = {"app": defn.name, **selector, **defn.labels, **ownership(operand.state)}
    pod["nodeSelector"] = {deploy_label(defn.deploy): "true", **defn.node_selector}
    if operand.account:
        pod["serviceAccountName"] = operand.account
    ds = obj("apps/v1", "DaemonSet", defn.name, operand.state, ctx.ns)
    ds["metadata"]["labels"].update(labels)
    ds["spec"] = {
        "selector": {"matchLabels": selector},
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
    }
    fields = defn.image.fields(ctx)
    main = pod["containers"][0]
    apply_image(main, pod, image, fields)
    apply_component(pod, main, fields)
    _wire_validation_inits(pod, ctx)
    common_config(ds, ctx.spec, on_delete=defn.on_delete)
    host_root(ds, ctx.spec.hostPaths.root())
    driver_install_dir(ds, ctx.spec.hostPaths.driver_install_dir())
    if defn.gpu_access:
        gpu_access(ds, ctx.spec, ctx.facts.runtime)
    for transform in defn.transforms:
        transform(ds, ctx)
    # last: fills only what the policy and the state left unset (no Role: no token)
    harden(ds, api_access=bool(operand.role_rules or operand.cluster_rules))
    return ds


def render_operand(operand: Operand, ctx: Ctx) -> tuple[list[Manifest], str]:
    """Objects to apply (in apply order) and a note for the state's reason."""
    objects = rbac(operand, ctx)
    if operand.extras:
        objects += operand.extras(ctx, operand.state)
    note = ""
    daemonsets: list[Manifest] = []
    if operand.daemonset or operand.daemonsets:
        if ctx.facts.has_gpu_nodes:
            if operand.daemonsets:
                daemonsets = operand.daemonsets(operand, ctx)
            elif operand.daemonset:
                daemonsets = [build_daemonset(operand.daemonset, operand, ctx)]
        else:
            note = "; DaemonSets wait for a GPU node (no node has nvidia.com/gpu.present=true)"
    objects += daemonsets
    return objects, note
