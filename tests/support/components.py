"""What the tests' bare component pods run as (`tests/integration/test_sim_standins.component_pod`)."""

from __future__ import annotations

from typing import Any

# The ServiceAccount of a test's bare component pod: the `namespace` fixture creates it and binds it
# to cluster-admin (such a pod has no rendered RBAC; the stand-ins call with its identity).
COMPONENT_ACCOUNT = "sim-component"


def component_account(kube: Any, namespace: str) -> str:
    """COMPONENT_ACCOUNT in `namespace`, bound to cluster-admin (a simulator a test started with
    `sim up`, whose pods live in "default"); returns the binding's name."""
    from lightkube.resources.core_v1 import ServiceAccount
    from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

    binding = f"{COMPONENT_ACCOUNT}-{namespace}"
    kube.apply(
        ServiceAccount.from_dict({"metadata": {"name": COMPONENT_ACCOUNT, "namespace": namespace}}),
        field_manager="tests",
    )
    kube.apply(
        ClusterRoleBinding.from_dict(
            {
                "metadata": {"name": binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": COMPONENT_ACCOUNT, "namespace": namespace}],
            }
        ),
        field_manager="tests",
    )
    return binding
