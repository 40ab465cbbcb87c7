"""The DRA driver's ServiceAccounts and what each may do (NVIDIA's DRA driver reads and writes these
resources; the rules are the facts of its chart)."""

from __future__ import annotations

from collections.abc import Callable

from gpu_operator.render.dra.common import DRACtx
from gpu_operator.render.objects import obj
from gpu_operator.render.operand import grant, rule, scc
from gpu_operator.render.result import Manifest

READ = ["get", "list", "watch"]
CRUD = ["get", "list", "watch", "create", "update", "delete"]
RESOURCE = "resource.k8s.io"
NVIDIA_RESOURCE = "resource.nvidia.com"
CD_DAEMON_ACCOUNT = "compute-domain-daemon-service-account"
CD_DAEMON = "compute-domain-daemon"


def _account(ctx: DRACtx, state: str, name: str, labels: dict[str, str]) -> Manifest:
    sa = obj("v1", "ServiceAccount", name, state, ctx.ns)
    sa["metadata"]["labels"].update(labels)
    return sa


def driver_rbac(
    ctx: DRACtx, state: str, plugin: str, controller: str, labels: Callable[[str], dict[str, str]]
) -> list[Manifest]:
    """ServiceAccounts, Roles and ClusterRoles of the kubelet plugin, and with compute domains those
    of the controller and the IMEX daemons it starts; the SCC on OpenShift."""
    plugin_labels = {k: v for k, v in labels("nvidia-dra-driver-kubelet-plugin").items() if k != "app"}
    out = [_account(ctx, state, plugin, plugin_labels)]
    domains = ctx.spec.draDriver.compute_domains_on()
    if domains:
        out.append(
            _account(ctx, state, controller, {k: v for k, v in labels(controller).items() if k != "app"})
        )
        out += grant(
            "ClusterRole",
            controller,
            state,
            ctx.ns,
            [
                rule([NVIDIA_RESOURCE], ["computedomains"], ["get", "list", "watch", "update"]),
                rule([NVIDIA_RESOURCE], ["computedomains/status"], ["update"]),
                rule([RESOURCE], ["resourceclaimtemplates"], CRUD),
                rule([""], ["nodes"], [*READ, "update"]),
                rule([""], ["pods"], READ),
            ],
            controller,
        )
        out += grant(
            "Role",
            controller,
            state,
            ctx.ns,
            [
                rule(["apps"], ["daemonsets"], [*CRUD[:5], "patch", "delete"]),
                rule([NVIDIA_RESOURCE], ["computedomaincliques"], [*READ, "update"]),
                # its leader-election Lease, in this namespace and by name (NVIDIA's chart grants every
                # Lease of the cluster: the operator would have to hold that too to hand it on)
                rule(["coordination.k8s.io"], ["leases"], ["create"]),
                rule(["coordination.k8s.io"], ["leases"], ["get", "update"], [controller]),
            ],
            controller,
        )
        out.append(
            _account(
                ctx,
                state,
                CD_DAEMON_ACCOUNT,
                {"app.kubernetes.io/name": "nvidia-dra-driver", "app.kubernetes.io/component": CD_DAEMON},
            )
        )
        out += grant(
            "ClusterRole",
            CD_DAEMON,
            state,
            ctx.ns,
            [
                rule(
                    [NVIDIA_RESOURCE], ["computedomains", "computedomains/status"], [*READ, "update", "patch"]
                ),
                rule([NVIDIA_RESOURCE], ["computedomaincliques"], [*READ, "create", "update", "patch"]),
                rule([""], ["pods"], READ),
            ],
            CD_DAEMON_ACCOUNT,
        )
        # it labels its own pod: in this namespace only (NVIDIA's chart grants pods patch cluster-wide,
        # which the operator would have to hold too); the chart's gpu-operator-operand-pods admission
        # policy holds it to its own pod's metadata
        out += grant("Role", CD_DAEMON, state, ctx.ns, [rule([""], ["pods"], ["patch"])], CD_DAEMON_ACCOUNT)
        out += grant(
            "Role",
            plugin,
            state,
            ctx.ns,
            [rule([NVIDIA_RESOURCE], ["computedomaincliques"], ["get"])],
            plugin,
        )
    if ctx.gate_on("MPSSupport"):  # the plugin starts an MPS control daemon Deployment per shared GPU
        out += grant(
            "Role",
            f"{plugin}-mps",
            state,
            ctx.ns,
            [rule(["apps"], ["deployments"], [*CRUD[:5], "patch", "delete"])],
            plugin,
        )
    # its driver-validation init container looks for the driver DaemonSets
    out += grant(
        "Role",
        f"{plugin}-driver-validation",
        state,
        ctx.ns,
        [rule(["apps"], ["daemonsets"], ["list"])],
        plugin,
    )
    out += grant(
        "ClusterRole",
        plugin,
        state,
        ctx.ns,
        [
            rule([NVIDIA_RESOURCE], ["computedomains"], READ),
            rule([RESOURCE], ["resourceclaims"], READ),
            rule([RESOURCE], ["resourceslices"], CRUD),
            rule([""], ["nodes"], [*READ, "update", "patch"]),
            rule([""], ["pods"], READ),
        ],
        plugin,
    )
    if ctx.facts.openshift:
        users = [f"system:serviceaccount:{ctx.ns}:{plugin}"]
        if domains:
            users.append(f"system:serviceaccount:{ctx.ns}:{CD_DAEMON_ACCOUNT}")
        out.append(scc("nvidia-dra-driver", state, users))
    return out
