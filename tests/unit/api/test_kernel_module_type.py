"""kernelModuleType: precompiled and runcompiled are common mix-ups; their errors name the field that does it."""

from __future__ import annotations

from collections.abc import Iterator

import pydantic
import pytest
import yaml

from gpu_operator.api import crdgen
from gpu_operator.api.clusterpolicy import DriverSpec
from gpu_operator.api.common import MISPLACED_MODULE_TYPES
from gpu_operator.api.nvidiadriver import NVIDIADriverSpec


@pytest.mark.parametrize("model", [DriverSpec, NVIDIADriverSpec])
def test_precompiled_points_at_use_precompiled(model: type[pydantic.BaseModel]) -> None:
    with pytest.raises(pydantic.ValidationError, match="usePrecompiled: true"):
        model.model_validate({"kernelModuleType": "precompiled", "image": "driver"})
    with pytest.raises(pydantic.ValidationError, match=r"usePrecompiled: false \(the default\)"):
        model.model_validate({"kernelModuleType": "runcompiled", "image": "driver"})
    with pytest.raises(pydantic.ValidationError, match="'auto', 'open' or 'proprietary'"):
        model.model_validate({"kernelModuleType": "closed", "image": "driver"})
    assert model.model_validate({"kernelModuleType": "open", "image": "driver"}).kernelModuleType == "open"  # type: ignore[attr-defined]


@pytest.mark.parametrize("crd", ["nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml"])
def test_the_crds_cel_rule_gives_each_misplaced_value_its_hint(crd: str) -> None:
    """The generated rule's message expression, evaluated for each value as the apiserver would."""
    schema = yaml.safe_load((crdgen.package_dir() / crd).read_text())["spec"]["versions"][0]["schema"]
    found = list(_rules(schema["openAPIV3Schema"], "kernelModuleType"))
    assert len(found) == 1
    rule = found[0]
    for value, hint in MISPLACED_MODULE_TYPES.items():
        assert _cel_message(rule["messageExpression"], value) == hint
    assert (
        _cel_message(rule["messageExpression"], "closed")
        == "unsupported value closed: use one of auto, open, proprietary"
    )
    assert rule["rule"] == "self in ['auto', 'open', 'proprietary']"


def _rules(node: object, field: str) -> Iterator[dict[str, str]]:
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            if key == field:
                yield from value.get("x-kubernetes-validations", [])
        for value in node.values():
            yield from _rules(value, field)


def _cel_message(expression: str, value: str) -> str:
    """The expression's value for `self == value`: the chained `self == 'x' ? 'text' : ...` form
    the generator writes, read branch by branch (a parse of exactly that form, no CEL engine)."""
    rest = expression
    while rest.startswith("self == '"):
        literal, _, rest = rest.removeprefix("self == '").partition("' ? '")
        text, _, rest = rest.partition("' : ")
        if literal == value:
            return text
    head, _, tail = rest.partition(" + self + ")
    return head.strip("'") + value + tail.strip("'")
