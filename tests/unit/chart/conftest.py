"""Fixtures for the Helm chart tests: the chart rendered offline by Helm's own engine (helm-python-sdk)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import helm_python
import pytest

from tests.unit.chart.chart_helpers import CHART, NAMESPACE, Rendered, Values, deep_merge


@pytest.fixture(scope="session")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: helm_python.Chart) -> Callable[..., Rendered]:
    """render(values) -> {template path: manifest}, as `helm template` with nfd disabled.

    NFD is a chart dependency fetched from a registry; offline its subchart is absent, so the
    tests render with nfd.enabled=false unless a test says otherwise.
    """

    def run(values: Values | None = None, *, namespace: str = NAMESPACE) -> Rendered:
        layered = deep_merge({"nfd": {"enabled": False}}, values or {})
        return chart.render(layered, name="gpu-operator", namespace=namespace, is_install=True)

    return run
