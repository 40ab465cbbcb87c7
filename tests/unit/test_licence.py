"""The licence is stated the same way everywhere a user or a packager looks for it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_apache_2_in_the_licence_file_pyproject_and_charts() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert set(project["license-files"]) == {"LICENSE", "NOTICE"}
    charts = [REPO / "deployments/gpu-operator/Chart.yaml", *REPO.glob("deployments/cozystack/**/Chart.yaml")]
    assert len(charts) >= 2
    for chart in charts:
        assert yaml.safe_load(chart.read_text())["annotations"]["artifacthub.io/license"] == "Apache-2.0", (
            chart
        )
    # the image's OCI label: tests/image/test_image.py reads it from the built image's config


def test_notice_names_where_the_upstream_facts_come_from() -> None:
    notice = (REPO / "NOTICE").read_text()
    for source in (
        "https://github.com/NVIDIA/gpu-operator",
        "https://github.com/kubernetes/kubernetes",
        "https://github.com/kubevirt/kubevirt",
        "53822513.nvidia.com",
    ):
        assert source in notice, source
