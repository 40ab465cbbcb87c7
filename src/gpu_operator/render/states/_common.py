"""Pieces several state modules share: gates, validation init containers, services, config maps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_operator.api.clusterpolicy import Component
from gpu_operator.api.common import Model
from gpu_operator.render.objects import (
    NODE_NAME,
    OPERATOR_NAMESPACE,
    POD_NAME,
    Ctx,
    container,
    env,
    hostpath,
    mount,
    obj,
)
from gpu_operator.render.operand import Gate
from gpu_operator.render.result import Manifest
from gpu_operator.vocabulary import VALIDATIONS_DIR

VALIDATIONS = hostpath("run-nvidia-validations", VALIDATIONS_DIR, "DirectoryOrCreate")
HOST_ROOT = hostpath("host-root", "/")
HOST_DEV_CHAR = hostpath("host-dev-char", "/dev/char")
DRIVER_INSTALL_DIR = hostpath("driver-install-dir", "/run/nvidia/driver", "DirectoryOrCreate")
SYS = hostpath("host-sys", "/sys", "Directory")
# The host root's sysfs, mounted read-write at /host/sys over a read-only host root: it moves with
# a custom host root (hostPaths.rootFS), as host-root does (transforms/daemonset.host_root).
HOST_ROOT_SYS = hostpath("host-root-sys", "/sys", "Directory")
DEVICE_PLUGINS = hostpath("device-plugin", "/var/lib/kubelet/device-plugins")


def _is_on(ctx: Ctx, field: str) -> bool:
    component = getattr(ctx.spec, field)
    assert isinstance(component, Component)
    return component.on()


def _because(ctx: Ctx, field: str) -> str:
    component = getattr(ctx.spec, field)
    value = component.on()
    source = "" if component.enabled is not None else " (default)"
    return f"spec.{field}.enabled={str(value).lower()}{source}"


def when_enabled(field: str) -> Gate:
    """Enabled when spec.<field> is enabled (with the Go default when unset)."""

    def gate(ctx: Ctx) -> tuple[bool, str]:
        return _is_on(ctx, field), _because(ctx, field)

    return gate


def always(reason: str) -> Gate:
    def gate(ctx: Ctx) -> tuple[bool, str]:
        return True, reason

    return gate


def sandbox(field: str | None = None, mode: str | None = None) -> Gate:
    """Sandbox-workload operands: sandboxWorkloads.enabled (+ component enabled, + mode)."""

    def gate(ctx: Ctx) -> tuple[bool, str]:
        if not ctx.spec.sandbox_on():
            return False, "spec.sandboxWorkloads.enabled=false"
        if field and not _is_on(ctx, field):
            return False, _because(ctx, field)
        if mode and ctx.spec.sandbox_mode() != mode:
            return False, f"spec.sandboxWorkloads.mode={ctx.spec.sandbox_mode()} (needs {mode})"
        parts = ["spec.sandboxWorkloads.enabled=true"]
        if field:
            parts.append(_because(ctx, field))
        if mode:
            parts.append(f"mode={mode}")
        return True, ", ".join(parts)

    return gate


def wait_for(component: str, ready_file: str) -> dict[str, Any]:
    """An init container that blocks until another operand's status file exists on the host."""
    path = f"{VALIDATIONS_DIR}/{ready_file}"
    return container(
        f"{component}-validation",
        command=["sh", "-c"],
        args=[f"until [ -f {path} ]; do echo waiting for {ready_file}; sleep 5; done"],
        mounts=[mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="HostToContainer")],
        privileged=True,
    )


def validator_init(
    component: str, *extra_env: dict[str, Any], wait: bool = True, mounts: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """An init container running one validator component (COMPONENT=<name>, waiting until it passes).

    It runs as root (the validator image's user is 1000; chroot and the status files need uid 0)
    and knows its namespace (the driver check looks up the driver DaemonSets there; the workload
    checks start their pods there, owned like and tolerating what this pod, POD_NAME, does). Without `wait` (WITH_WAIT=false, upstream's choice for the
    toolkit, cuda and plugin checks) a failed check exits and the kubelet retries the container.
    """
    ctr = container(
        f"{component}-validation",
        command=["sh", "-c"],
        args=["nvidia-validator"],
        env_vars=[
            env("WITH_WAIT", str(wait).lower()),
            env("COMPONENT", component),
            NODE_NAME,
            OPERATOR_NAMESPACE,
            POD_NAME,
            *extra_env,
        ],
        mounts=mounts or [mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="Bidirectional")],
        privileged=True,
    )
    ctr.setdefault("securityContext", {})["runAsUser"] = 0
    return ctr


def configmap(name: str, state: str, ctx: Ctx, data: dict[str, str]) -> Manifest:
    return obj("v1", "ConfigMap", name, state, ctx.ns, data=data)


def service(
    name: str, state: str, ns: str, port: int, port_name: str, app: str, scrape: bool = False, **spec: Any
) -> Manifest:
    """A Service for one operand's port; `scrape` adds Prometheus' annotation-based discovery."""
    svc = obj(
        "v1",
        "Service",
        name,
        state,
        ns,
        spec={
            "selector": {"app": app},
            "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}],
            **spec,
        },
    )
    svc["metadata"]["labels"]["app"] = app
    if scrape:
        svc["metadata"]["annotations"] = {"prometheus.io/scrape": "true"}
    return svc


def service_monitor(
    name: str,
    state: str,
    ctx: Ctx,
    port_name: str,
    app: str,
    *,
    interval: str | None = None,
    scrape_timeout: str | None = None,
    honor_labels: bool | None = None,
    labels: dict[str, str] | None = None,
    relabelings: Sequence[Model] | None = None,
) -> list[Manifest]:
    """A ServiceMonitor, only when the monitoring.coreos.com CRD exists (like upstream)."""
    if not ctx.facts.servicemonitor_crd:
        return []
    endpoint: dict[str, Any] = {"port": port_name, "path": "/metrics"}
    rules = [r.dump() for r in relabelings] if relabelings is not None else None
    for key, value in (
        ("interval", interval),
        ("scrapeTimeout", scrape_timeout),
        ("honorLabels", honor_labels),
        ("relabelings", rules),
    ):
        if value is not None:
            endpoint[key] = value
    monitor = obj(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        name,
        state,
        ctx.ns,
        spec={
            "jobLabel": "app",
            "namespaceSelector": {"matchNames": [ctx.ns]},
            "selector": {"matchLabels": {"app": app}},
            "endpoints": [endpoint],
        },
    )
    monitor["metadata"]["labels"].update(labels or {})
    return [monitor]
