"""Our custom resources the operator watches: one row each, the one place a watched CR is named.

Everything else is read from the rows: the watches (controllers/watches.py) index and watch each
row's resource; the read model (controllers/readmodel.py) keeps its objects under the row's index
id and answers `objects(row)` (a pass's `ReadSnapshot.objects(row)` too); an event of one is
`ObjectEvent(EventKind.CUSTOM_RESOURCE, resource=row)`, which a unit wants with `event.of(row)`
(controllers/loop.py); the table of every watched kind (controllers/watchedkinds.py) starts with
these rows. A new CR is its api model (which sets `CRD`: its CRD and the chart's rules follow), one
row here and its unit (docs/architecture.md, "Growing it"); a kind that needs nothing but its
model's parse takes `plain_view(Model)` for its view."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast

import pydantic

from gpu_operator.api import clusterpolicy, gpucluster, nvidiadriver
from gpu_operator.controllers.views import ClusterPolicyView, CRView, GPUClusterView, NVIDIADriverView

V = TypeVar("V", bound=CRView[Any])
WATCH_VERBS = ("list", "watch")  # what a watch needs granted (a list, then a watch from it)
M = TypeVar("M", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class CustomResource(Generic[V]):
    """One of our watched CRs: its API coordinates and the view its objects are kept as; as a
    row of the table of watched kinds (controllers/watchedkinds.py), cluster-scoped, always
    watched, with list and watch; its events are CUSTOM_RESOURCE ones naming the row."""

    group: str
    version: str
    plural: str
    kind: str
    view: type[V]
    namespaced: ClassVar[bool] = False
    needs: ClassVar[str] = ""
    verbs: ClassVar[tuple[str, ...]] = WATCH_VERBS

    @property
    def index_id(self) -> str:
        """kopf's index id (a keyword its startup handler is called with; the prefix keeps a
        plural from shadowing one of kopf's own keywords)."""
        return "cr_" + self.plural.replace("-", "_")

    @property
    def resource(self) -> tuple[str, str, str]:
        """kopf's (group, version, plural)."""
        return (self.group, self.version, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def plain_view(model: type[M]) -> type[CRView[M]]:
    """The view of a kind whose objects need nothing beyond their model's parse (`CRView.parsed`)."""
    name = f"{model.__name__}View"
    attrs = {"MODEL": model, "__module__": model.__module__, "__qualname__": name}
    return cast("type[CRView[M]]", type(name, (CRView,), attrs))


CLUSTER_POLICY = CustomResource(
    clusterpolicy.GROUP, clusterpolicy.VERSION, clusterpolicy.PLURAL, clusterpolicy.KIND, ClusterPolicyView
)
NVIDIA_DRIVER = CustomResource(
    nvidiadriver.GROUP, nvidiadriver.VERSION, nvidiadriver.PLURAL, nvidiadriver.KIND, NVIDIADriverView
)
GPU_CLUSTER = CustomResource(
    gpucluster.GROUP, gpucluster.VERSION, gpucluster.PLURAL, gpucluster.KIND, GPUClusterView
)
CUSTOM_RESOURCES: tuple[CustomResource[Any], ...] = (CLUSTER_POLICY, NVIDIA_DRIVER, GPU_CLUSTER)
