"""Node labelling, the upgrade controller and the api model cannot disagree about a ClusterPolicy.

LabelPolicy and the upgrade controller's owner are derived from the pydantic ClusterPolicySpec
(api/clusterpolicy.py), the model the renderer reads. Over generated specs (absent keys, nulls,
values the model rejects) and every example policy, what the labeller and the upgrade controller
decide for a GPU node follows the api model's own rules: the default workload, the sandbox mode,
the MIG config default, driver auto-upgrade. A spec the model rejects gives neither a policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.controllers.units.labels.nodelabels import desired_change
from gpu_operator.controllers.units.upgrade.owners import clusterpolicy_owner
from gpu_operator.controllers.views import ClusterPolicyView
from gpu_operator.vocabulary import (
    GPU_PRODUCT,
    KATA_SANDBOX_DEVICE_PLUGIN,
    MIG_CAPABLE,
    MIG_CONFIG,
    STATE_LABELS,
    UPGRADE_ENABLED_ANNOTATION,
    deploy_label,
)
from tests.unit.controllers.labelkit import policy_of

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("clusterpolicy-*.yaml"))
# A MIG-capable GPU node without a workload label: every policy decision shows on it.
NODE = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
    MIG_CAPABLE: "true",
}  # as GFD publishes for an H100

flag = st.none() | st.booleans()


def mostly(*valid: Any, bad: Any) -> st.SearchStrategy[Any]:
    """One of the valid values, now and then one the model rejects."""
    return st.sampled_from([*valid, *valid, *valid, bad])


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any] | None]:
    """A dict with any subset of the fields (absent keys take the model's defaults), now and then
    null (which the model rejects: the apiserver prunes nulls of non-nullable objects)."""
    present = st.fixed_dictionaries({}, optional=fields)
    return st.integers(0, 3).flatmap(lambda i: st.none() if i == 0 else present)


specs = st.fixed_dictionaries(
    {},
    optional={
        "sandboxWorkloads": optional(
            enabled=flag,
            defaultWorkload=mostly("container", "vm-passthrough", "vm-vgpu", bad="bogus"),
            mode=mostly("kubevirt", "kata", bad="bogus"),
        ),
        "migManager": optional(
            enabled=flag,
            config=optional(
                default=mostly("all-disabled", "", bad="bogus"), name=st.sampled_from(["custom", None])
            ),
        ),
        "driver": optional(
            enabled=flag,
            useNvidiaDriverCRD=flag,
            upgradePolicy=optional(
                autoUpgrade=mostly(True, False, bad=None),
                maxParallelUpgrades=mostly(0, 1, 4, bad=-1),
                maxUnavailable=st.sampled_from(["25%", 2]),
            ),
        ),
    },
)


def check(raw: dict[str, Any]) -> None:
    body = {"metadata": {"name": "cluster-policy", "uid": "u"}, "spec": raw}
    try:
        spec = ClusterPolicySpec.model_validate(raw)
    except pydantic.ValidationError:
        assert policy_of(raw) is None
        assert clusterpolicy_owner(ClusterPolicyView.of(body)) is None
        return
    policy = policy_of(raw)
    owner = clusterpolicy_owner(ClusterPolicyView.of(body))
    assert policy is not None and owner is not None
    change = desired_change(dict(NODE), {}, policy)
    deploy = {k for k, v in change.labels.items() if v == "true" and k.startswith(deploy_label(""))}

    # The workload stack is the api's default workload, in the api's sandbox mode.
    stack = set(STATE_LABELS[spec.default_workload()])
    if spec.default_workload() == "vm-passthrough" and spec.sandbox_mode() == "kata":
        stack = (stack - {deploy_label("sandbox-device-plugin")}) | {KATA_SANDBOX_DEVICE_PLUGIN}
    assert deploy - {deploy_label("mig-manager")} == stack

    # The MIG config label follows the api's migManager switch and config default.
    config = spec.migManager.config
    wants_mig_config = spec.migManager.on() and config is not None and config.default == "all-disabled"
    assert (change.labels.get(MIG_CONFIG) == "all-disabled") == wants_mig_config

    # Driver auto-upgrade: the api's rule, the node annotation and the upgrade controller agree.
    assert policy.driver_auto_upgrade == spec.driver_auto_upgrade() == owner.policy.auto_upgrade
    if not spec.driver.useNvidiaDriverCRD:
        annotated = change.annotations.get(UPGRADE_ENABLED_ANNOTATION) == "true"
        assert annotated == spec.driver_auto_upgrade()
    upgrade = spec.driver_upgrade_policy()
    if upgrade is not None:
        assert (owner.policy.max_parallel, owner.policy.max_unavailable) == (
            upgrade.maxParallelUpgrades,
            upgrade.maxUnavailable,
        )


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(specs)
def test_generated_specs(raw: dict[str, Any]) -> None:
    check(raw)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_policies(example: Path) -> None:
    check(yaml.safe_load(example.read_text())["spec"])


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 4
