"""kernelModuleType: precompiled is a common mix-up; its error names the field that does it."""

from __future__ import annotations

import pydantic
import pytest

from gpu_operator.api.clusterpolicy import DriverSpec
from gpu_operator.api.nvidiadriver import NVIDIADriverSpec


@pytest.mark.parametrize("model", [DriverSpec, NVIDIADriverSpec])
def test_precompiled_points_at_use_precompiled(model: type[pydantic.BaseModel]) -> None:
    with pytest.raises(pydantic.ValidationError, match="usePrecompiled: true"):
        model.model_validate({"kernelModuleType": "precompiled", "image": "driver"})
    with pytest.raises(pydantic.ValidationError, match="'auto', 'open' or 'proprietary'"):
        model.model_validate({"kernelModuleType": "closed", "image": "driver"})
    assert model.model_validate({"kernelModuleType": "open", "image": "driver"}).kernelModuleType == "open"  # type: ignore[attr-defined]
