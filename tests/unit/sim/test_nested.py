"""`sim demo --nested`'s checks that need no cluster: the tenant's resource name against the host's,
the guest node shape for the VM's GPU count, the platform package's values for a variant."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.sim.commands import nested, nestedhost


def test_a_tenant_asking_for_another_name_fails_naming_both() -> None:
    with pytest.raises(nestedhost.NameMismatch) as err:
        nested.check_names(
            "nvidia.com/GH100_H100_SXM5_80GB", nested.SEED_001_RESOURCE, {nested.SEED_001_RESOURCE: "8"}
        )
    assert (err.value.tenant, err.value.published) == (
        "nvidia.com/GH100_H100_SXM5_80GB",
        nested.SEED_001_RESOURCE,
    )
    nested.check_names(nested.SEED_001_RESOURCE, nested.SEED_001_RESOURCE, {nested.SEED_001_RESOURCE: "8"})


def test_the_guest_shape_matches_the_vms_gpus() -> None:
    from gpu_operator import shapes

    shape = shapes.load(nested.guest_shape(2))
    assert shape.gpu_count == 2 and shape.gpu_vendor_device == nested.H100_SXM5
    with pytest.raises(nestedhost.NestedError):
        nested.guest_shape(3)
    with pytest.raises(nestedhost.NestedError):
        nested.run(Path("/nonexistent"), print, gpus=9)


def test_the_package_values_layer_the_variant_on_the_common_file() -> None:
    guest = nestedhost.package_values("guest")
    assert guest["driver"]["enabled"] is True and guest["sandboxWorkloads"]["enabled"] is False
    assert guest["ccManager"]["enabled"] is False  # from values.yaml
    host = nestedhost.package_values("passthrough")
    assert host["sandboxWorkloads"]["defaultWorkload"] == "vm-passthrough"
    with pytest.raises(nestedhost.NestedError):
        nestedhost.package_values("nope")
