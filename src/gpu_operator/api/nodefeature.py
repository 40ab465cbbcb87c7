"""NodeFeature, nfd.k8s-sigs.io/v1alpha1: the object NVIDIA's GPU feature discovery (GFD) publishes
its node labels in (its default output since v0.15; the chart deploys v0.20.0). Node Feature
Discovery's master turns these objects into Node labels; without NFD, the operator's node
labelling mirrors GFD's `nvidia.com/` labels itself (docs/architecture.md, "GFD's labels").

The schema is ours and only as strict as GFD's writes need: `spec.labels` a map of strings,
`spec.features` left open. NFD's own CRD (a richer `features` schema) is accepted by the same
objects, so a cluster may carry either; the operator creates this CRD only where it is absent
(`gpu-operator crds apply`, the chart's hook, while our node discovery stands in for NFD).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gpu_operator.api.common import Model
from gpu_operator.vocabulary import NODE_FEATURE_GROUP, NODE_FEATURE_PLURAL, NODE_FEATURE_VERSION

GROUP = NODE_FEATURE_GROUP
VERSION = NODE_FEATURE_VERSION
PLURAL = NODE_FEATURE_PLURAL
KIND = "NodeFeature"
SCOPE = "Namespaced"


class NodeFeatureSpec(Model):
    labels: dict[str, str] = Field(
        default_factory=dict, description="Labels to put on the node the object names."
    )
    features: dict[str, Any] = Field(
        default_factory=dict,
        description="Raw features (flags, attributes, instances) for NFD's rules; GFD leaves them empty.",
    )
