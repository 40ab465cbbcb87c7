"""The health agent's --validations (HEALTH_VALIDATIONS): `none` for a pod whose own checks ran first."""

from __future__ import annotations

import pytest
import typer

from gpu_operator.node.health.command import NO_VALIDATIONS, _validations


def test_none_expects_no_status_file_and_names_are_checked() -> None:
    assert _validations(NO_VALIDATIONS) == () and _validations(" None ") == ()
    assert _validations("driver,plugin") == ("driver", "plugin")
    with pytest.raises(typer.BadParameter, match="unknown component.*drivr.*or none"):
        _validations("drivr")
