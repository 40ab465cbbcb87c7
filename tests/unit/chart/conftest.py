"""Fixtures for the Helm chart tests: the chart loaded once per session, rendered through tests.support.chart."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import helm_python
import pytest

from tests.support.chart import CHART, NAMESPACE, Rendered, Values, render_chart


@pytest.fixture(scope="session")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: helm_python.Chart) -> Callable[..., Rendered]:
    """render(values) -> {template path: manifest}, as `helm template` with nfd disabled."""

    def run(values: Values | None = None, *, namespace: str = NAMESPACE) -> Rendered:
        return render_chart(values, namespace=namespace, chart=chart)

    return run
