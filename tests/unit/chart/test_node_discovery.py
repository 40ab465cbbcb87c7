"""nfd.enabled (the default): NFD is not shipped; the chart runs our node-discovery DaemonSet
instead, on every Linux node, reading the host read-only and allowed to patch Nodes only."""

from __future__ import annotations

from collections.abc import Callable

import kubernetes_validate

from tests.support.chart import Rendered, find, objects

NAME = "gpu-operator-node-discovery"


def test_nfd_enabled_runs_our_discovery_daemonset_and_nothing_of_nfd(render: Callable[..., Rendered]) -> None:
    on = render({"nfd": {"enabled": True}})
    off = render({"nfd": {"enabled": False}})
    # (the operator's args and the CRD hook differ too: GFD's labels, tests/unit/chart/test_chart_render.py)
    names_off = {(o["kind"], o["metadata"]["name"]) for o in objects(off)}
    added = [o for o in objects(on) if (o["kind"], o["metadata"]["name"]) not in names_off]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in added) == sorted(
        (kind, NAME) for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet")
    )
    assert not any(name.startswith("gpu-operator/charts/") for name in on)  # no subchart
    for obj in added:
        kubernetes_validate.validate(obj, "1.36.0", strict=True)
    assert find(on, "ClusterRole", NAME)["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
    ]

    pod = find(on, "DaemonSet", NAME)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:4] == ["gpu-operator", "node", "discover", "--publish"]
    assert "--host-root=/host" in container["command"]
    assert (
        container["image"]
        == find(on, "Deployment", "gpu-operator")["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    assert pod["tolerations"] == [{"operator": "Exists"}] and pod["nodeSelector"] == {
        "kubernetes.io/os": "linux"
    }
    assert container["volumeMounts"] == [{"name": "host-root", "mountPath": "/host", "readOnly": True}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
