"""What `gpu-operator cleanup` takes back of node labelling (controllers/cleanup.py, `TakeBack`):
every nvidia.com/ label and annotation our field managers wrote (controllers/cleanup.py's
`strip_nodes`, which this unit runs too when the last ClusterPolicy goes). The last step: the
others read records among these annotations (whose cordon it is)."""

from __future__ import annotations

from gpu_operator.controllers.cleanup import Uninstall, strip_nodes

TAKES_OUR_ANNOTATIONS = True  # runs after every other step (controllers/units/__init__.py, take_backs)


async def take_back(uninstall: Uninstall) -> list[str]:
    """Lists the nodes afresh: the steps before it patched them."""
    return [f"node {name}: our labels and annotations removed" for name in await strip_nodes(uninstall.kube)]
