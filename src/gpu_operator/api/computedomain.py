"""ComputeDomain and ComputeDomainClique, resource.nvidia.com/v1beta1: the IMEX side of NVIDIA's DRA
driver. The operator ships their CRDs (as NVIDIA's chart does) and never writes these objects: a
user creates a ComputeDomain, the DRA driver's compute-domain controller makes its claim template
and IMEX daemons, and the daemons record themselves in the cliques. The schema follows the DRA
driver's (NVIDIA/k8s-dra-driver-gpu api/nvidia.com/resource/v1beta1: computedomain.go,
computedomainclique.go).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.config import JsonDict

from gpu_operator.api.common import Model

GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
SCOPE = "Namespaced"
Readiness = Literal["Ready", "NotReady"]


def _list_map(key: str) -> JsonDict:
    """A list keyed by one field (server-side apply merges its items by that key)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


class ResourceClaimTemplateRef(Model):
    name: str


class ComputeDomainChannel(Model):
    """The ResourceClaimTemplate the controller makes in the ComputeDomain's namespace, which a
    workload's pods reference to join the domain; All asks for every IMEX channel, Single for one."""

    resourceClaimTemplate: ResourceClaimTemplateRef
    allocationMode: Literal["All", "Single"] = "Single"


class ComputeDomainSpec(Model):
    """Immutable once created."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}
            ]
        }
    )

    # how many IMEX daemons (nodes) make the domain ready; deprecated upstream, 0 with DNS names
    numNodes: int = Field(0, ge=0)
    channel: ComputeDomainChannel


class _IMEXDaemon(Model):
    """One IMEX daemon: its address, its NVLink clique, its index there (a stable DNS name)."""

    ipAddress: str
    cliqueID: str
    index: int | None = None
    status: Readiness = "NotReady"


class ComputeDomainNode(_IMEXDaemon):
    name: str


class ComputeDomainStatus(Model):
    status: Readiness = "NotReady"
    nodes: list[ComputeDomainNode] | None = Field(None, json_schema_extra=_list_map("name"))


class CliqueDaemon(_IMEXDaemon):
    nodeName: str


class CliqueBody(Model):
    """A clique's fields (top level of the object: it has no spec or status), named
    `<computeDomainUID>.<cliqueID>` in the driver's namespace."""

    daemons: list[CliqueDaemon] | None = Field(None, json_schema_extra=_list_map("nodeName"))
