"""The pieces of `sim demo --nested` (sim/commands/nested.py): the platform package's values, our chart
installed with them into a simulator, KubeVirt's objects on the host cluster (its CRD and CR,
virt-handler's DaemonSet) and a VM's pod, and the waits between them with progress lines.

What KubeVirt's own controllers would do is done here once, by hand, as its operator would leave
it: virt-operator deploys virt-handler as a DaemonSet (kubevirt pkg/virt-operator/resource/
generate/components/daemonsets.go: name virt-handler, pod label kubevirt.io=virt-handler), and
virt-controller makes one pod per running VM (label kubevirt.io=virt-launcher, the VM's host devices
as resource limits of its `compute` container, one unit per device). kwok runs both pods (nothing
runs in them); the device plugin and the kubelet's allocation are the stand-ins'
(sim/standins/virthandler.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.sim.standins.virthandler import KubeVirt

if TYPE_CHECKING:
    from gpu_operator.sim.plane.helm import Progress

REPO = Path(__file__).resolve().parents[4]
PACKAGE = REPO / "deployments" / "cozystack" / "packages" / "system" / "gpu-operator"
KUBEVIRT_CRD = REPO / "tests" / "fixtures" / "kubevirt" / "kubevirt.io_kubevirts.yaml"
KUBEVIRT_NAMESPACE = "cozy-kubevirt"  # seed 001's KubeVirt CR: cozy-kubevirt/kubevirt
KUBEVIRT_VERSION = "v1.6.0"
FIELD_MANAGER = "gpu-operator-sim"


class NestedError(RuntimeError):
    """A step of the nested chain failed; the message says which and what was seen."""


class NameMismatch(NestedError):
    """The tenant's VM asks for a resource name the host does not publish."""

    def __init__(self, message: str, tenant: str, published: str) -> None:
        super().__init__(message)
        self.tenant, self.published = tenant, published


def package_values(variant: str) -> dict[str, Any]:
    """Our chart's values from the platform package's variant, as its PackageSource layers them
    (values.yaml, then values-<variant>.yaml) and passes them to the dependency: the maps under
    `gpu-operator:`, merged the way `helm -f a -f b` does."""
    if not PACKAGE.is_dir():
        raise NestedError(
            f"the platform package is not in this installation ({PACKAGE}): run from the source tree"
        )
    merged: dict[str, Any] = {}
    for name in ("values.yaml", f"values-{variant}.yaml"):
        path = PACKAGE / name
        if not path.is_file():
            known = sorted(
                p.name.removeprefix("values-").removesuffix(".yaml") for p in PACKAGE.glob("values-*.yaml")
            )
            raise NestedError(f"variant {variant!r}: no {path}; the package's variants: {', '.join(known)}")
        merged = deep_merge(merged, (yaml.safe_load(path.read_text()) or {}).get("gpu-operator") or {})
    return merged


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        merged[key] = (
            deep_merge(merged[key], value)
            if isinstance(value, dict) and isinstance(merged.get(key), dict)
            else value
        )
    return merged


def wait(
    what: str,
    check: Callable[[], Any],
    progress: Progress,
    timeout: float,
    seen: Callable[[], str] = lambda: "",
) -> Any:
    """Poll `check` until it returns something true; a progress line every 10 s; on timeout a
    NestedError with what was last seen."""
    started = last = time.monotonic()
    while True:
        result = check()
        if result:
            return result
        now = time.monotonic()
        if now - started > timeout:
            raise NestedError(f"{what}: not after {timeout:.0f}s" + (f"; {seen()}" if seen() else ""))
        if now - last >= 10:
            progress(f"  still waiting for {what} ({now - started:.0f}s){'; ' + seen() if seen() else ''}")
            last = now
        time.sleep(0.5)


def ensure(client: Client, obj: dict[str, Any]) -> None:
    """Create an object; one that exists already is left as it is."""
    try:
        client.create(from_dict(obj))
    except ApiError as err:
        if err.status.code != 409:
            raise


def kubevirt_api(client: Client, progress: Progress) -> None:
    """KubeVirt's CRD (the fields we touch, tests/fixtures/kubevirt) and seed 001's CR, with the
    HostDevices feature gate and no device listed yet: the operator lists the GPUs."""
    if not KUBEVIRT_CRD.is_file():
        raise NestedError(
            f"KubeVirt's CRD is not in this installation ({KUBEVIRT_CRD}): run from the source tree"
        )
    client.apply(from_dict(yaml.safe_load(KUBEVIRT_CRD.read_text())), field_manager=FIELD_MANAGER, force=True)

    def served() -> bool:
        crd = client.get(CustomResourceDefinition, "kubevirts.kubevirt.io")
        conditions = (crd.status.conditions if crd.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait("KubeVirt's CRD established", served, progress, 30)
    ensure(client, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBEVIRT_NAMESPACE}})
    for _ in range(20):  # the new kind may take a moment to be served
        try:
            ensure(
                client,
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "KubeVirt",
                    "metadata": {"name": "kubevirt", "namespace": KUBEVIRT_NAMESPACE},
                    "spec": {"configuration": {"developerConfiguration": {"featureGates": ["HostDevices"]}}},
                },
            )
            break
        except ApiError as err:
            if err.status.code != 404:
                raise
            time.sleep(0.5)
    progress(
        f"KubeVirt's CRD and CR {KUBEVIRT_NAMESPACE}/kubevirt (feature gate HostDevices, no device listed)"
    )


def virt_handler(client: Client, progress: Progress) -> None:
    labels = {"kubevirt.io": "virt-handler"}
    ensure(
        client,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "virt-handler", "namespace": KUBEVIRT_NAMESPACE, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "virt-handler",
                                "image": f"quay.io/kubevirt/virt-handler:{KUBEVIRT_VERSION}",
                            }
                        ],
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                    },
                },
            },
        },
    )
    progress(f"virt-handler's DaemonSet in {KUBEVIRT_NAMESPACE} (as virt-operator deploys it)")


def permitted_name(client: Client, selector: str) -> str | None:
    """The resourceName KubeVirt's CR gives PCI ID `selector` (None: not listed yet)."""
    kubevirt = client.get(KubeVirt, "kubevirt", namespace=KUBEVIRT_NAMESPACE)
    config = (dict(kubevirt).get("spec") or {}).get("configuration") or {}
    for entry in (config.get("permittedHostDevices") or {}).get("pciHostDevices") or []:
        if str(entry.get("pciVendorSelector", "")).lower() == selector.lower():
            return str(entry.get("resourceName"))
    return None


def node_resources(client: Client, node: str) -> tuple[dict[str, str], dict[str, str]]:
    status = client.get(Node, node).status
    return (
        {k: str(v) for k, v in ((status.capacity if status else None) or {}).items()},
        {k: str(v) for k, v in ((status.allocatable if status else None) or {}).items()},
    )


def vm_pod(client: Client, namespace: str, name: str, resource: str, gpus: int) -> Pod:
    """The VM's pod as virt-controller makes it: its host devices as limits of `compute`."""
    ensure(client, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    limits = {resource: str(gpus)}
    ensure(
        client,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"virt-launcher-{name}",
                "namespace": namespace,
                "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": name},
            },
            "spec": {
                "containers": [
                    {
                        "name": "compute",
                        "image": f"quay.io/kubevirt/virt-launcher:{KUBEVIRT_VERSION}",
                        "resources": {"limits": limits, "requests": dict(limits)},
                    }
                ]
            },
        },
    )
    return client.get(Pod, f"virt-launcher-{name}", namespace=namespace)
