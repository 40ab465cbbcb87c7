"""What doctor needs from the cluster (the Node's workload label, passthrough list, MIG config and state,
KubeVirt's advertised GPUs): read through the API when it can, from options when offline, with a plain
note when neither."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_operator.node.doctor.vmchecks import Advertised
from gpu_operator.node.vfio.incluster import parse_passthrough_devices
from gpu_operator.vocabulary import PASSTHROUGH_DEVICES_ANNOTATION, WORKLOAD_CONFIG

OFFLINE_HINT = (
    "pass --advertised 10de:2330=N (what the Node shows for KubeVirt's resource) to compare offline"
)


@dataclass
class ClusterInputs:
    workload: str | None = None
    passthrough_devices: list[str] | None = None
    advertised: list[Advertised] | None = None
    unchecked: str = ""
    # the Node's labels and annotations where they were read (its MIG config and state among them)
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


def parse_advertised(values: list[str]) -> list[Advertised]:
    out = []
    for value in values:
        ids, sep, count = value.partition("=")
        vendor, colon, device = ids.strip().lower().partition(":")
        if not (sep and colon and len(vendor) == 4 and len(device) == 4 and count.strip().isdigit()):
            raise ValueError(f"--advertised {value!r}: expected VENDOR:DEVICE=COUNT, e.g. 10de:2330=8")
        out.append(Advertised(f"{vendor}:{device}", "", int(count)))
    return out


def cluster_inputs(
    node: str | None, workload: str | None, passthrough: str | None, advertised: list[str]
) -> ClusterInputs:
    inputs = ClusterInputs(workload=workload)
    if passthrough:
        inputs.passthrough_devices = parse_passthrough_devices(passthrough, "--passthrough-devices")
    if advertised:
        inputs.advertised = parse_advertised(advertised)
    if not node:
        if inputs.advertised is None:
            inputs.unchecked = f"no --node (or NODE_NAME), so no API: {OFFLINE_HINT}"
        return inputs
    from httpx2 import HTTPError, HTTPStatusError
    from lightkube.core.exceptions import ApiError, ConfigError

    from gpu_operator.node.cluster.kubeapi import KubeNodeView

    try:
        view = KubeNodeView(node, "")
        labels, annotations = view.node_metadata()
    except (ConfigError, ApiError, HTTPError, OSError) as err:
        inputs.unchecked = f"could not read Node {node} through the API ({err}); {OFFLINE_HINT}"
        return inputs
    inputs.labels, inputs.annotations = labels, annotations
    inputs.workload = inputs.workload or labels.get(WORKLOAD_CONFIG) or None
    listed = annotations.get(PASSTHROUGH_DEVICES_ANNOTATION, "")
    if inputs.passthrough_devices is None and listed.strip():
        inputs.passthrough_devices = parse_passthrough_devices(
            listed, f"Node {node} annotation {PASSTHROUGH_DEVICES_ANNOTATION}"
        )
    if inputs.advertised is None:
        try:
            inputs.advertised = view.kubevirt_advertised()
        except ApiError as err:
            inputs.unchecked = (
                f"KubeVirt's API (kubevirt.io/v1 KubeVirt) is not readable ({err.status.message}): "
                "nothing to compare with"
            )
        except HTTPStatusError as err:
            # An API group the server does not know answers 404 with a plain-text body.
            code = err.response.status_code
            inputs.unchecked = (
                "KubeVirt's API (kubevirt.io/v1 KubeVirt) is not served in this cluster: nothing to compare with"
                if code == 404
                else f"could not list KubeVirt CRs (HTTP {code}); {OFFLINE_HINT}"
            )
        except (HTTPError, OSError) as err:
            inputs.unchecked = f"could not list KubeVirt CRs ({err}); {OFFLINE_HINT}"
    return inputs
