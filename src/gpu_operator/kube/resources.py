"""The kinds the operator names, as lightkube resources, and how an object is named: the
vocabulary kube/'s reads and writes share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import create_global_resource, create_namespaced_resource

FIELD_MANAGER = "gpu-operator"

ClusterPolicyResource = create_global_resource("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies")
NVIDIADriverResource = create_global_resource("nvidia.com", "v1alpha1", "NVIDIADriver", "nvidiadrivers")
GPUClusterResource = create_global_resource("nvidia.com", "v1alpha1", "GPUCluster", "gpuclusters")
# NVIDIA's DRA driver's IMEX kinds, whose CRDs we ship (registered for lists by kind).
ComputeDomainResource = create_namespaced_resource(
    "resource.nvidia.com", "v1beta1", "ComputeDomain", "computedomains"
)
ComputeDomainCliqueResource = create_namespaced_resource(
    "resource.nvidia.com", "v1beta1", "ComputeDomainClique", "computedomaincliques"
)
# OpenShift's kinds: the ClusterVersion tells the platform (kube/platform.py); operands get SCCs there.
ClusterVersionResource = create_global_resource(
    "config.openshift.io", "v1", "ClusterVersion", "clusterversions"
)
SecurityContextConstraintsResource = create_global_resource(
    "security.openshift.io", "v1", "SecurityContextConstraints", "securitycontextconstraints"
)
# Our CRs with a status subresource, by kind.
STATUS_RESOURCES: dict[str, Any] = {
    "ClusterPolicy": ClusterPolicyResource,
    "NVIDIADriver": NVIDIADriverResource,
    "GPUCluster": GPUClusterResource,
}
ServiceMonitorResource = create_namespaced_resource(
    "monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors"
)
PrometheusRuleResource = create_namespaced_resource(
    "monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules"
)


@dataclass(frozen=True)
class ObjectKey:
    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ObjectKey:
        meta = obj["metadata"]
        return cls(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def resource_for(api_version: str, kind: str) -> Any:
    """The lightkube resource class for an apiVersion/kind (built-ins and the CRDs we use)."""
    return resource_registry.load(api_version, kind)


def collection_path(
    group: str, version: str, plural: str, namespace: str | None = None, name: str = ""
) -> str:
    """The REST path of a collection (or, with `name`, of one object in it): `/api/v1/...` for the
    core group, `/apis/GROUP/VERSION/...` for the others."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{plural}" + (f"/{name}" if name else "")
