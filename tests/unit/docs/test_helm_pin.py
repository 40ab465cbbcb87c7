"""`./dev helm` (tools/helm/go.mod) is the Helm the Python packages' SDK wraps: the docs' helm
commands and the tests' helm_python calls run the same Helm version."""

from __future__ import annotations

from pathlib import Path

import helm_python

ROOT = Path(__file__).resolve().parents[3]


def required_version(go_mod: str, module: str) -> str | None:
    """The version `go_mod` requires of `module` (a `require` line or a line of a require block)."""
    for line in go_mod.splitlines():
        fields = line.split("//")[0].split()
        if fields[:1] == ["require"]:
            fields = fields[1:]
        if len(fields) == 2 and fields[0] == module:
            return fields[1]
    return None


def test_dev_helm_builds_the_helm_version_helm_python_sdk_wraps() -> None:
    pinned = required_version((ROOT / "tools" / "helm" / "go.mod").read_text(), "helm.sh/helm/v4")
    assert pinned is not None, "tools/helm/go.mod requires no helm.sh/helm/v4"
    assert pinned == helm_python.helm_sdk_version()


def test_required_version_reads_both_forms() -> None:
    text = "module x\n\nrequire a.b/c v1.2.3\n\nrequire (\n\thelm.sh/helm/v4 v4.2.3 // indirect\n)\n"
    assert required_version(text, "a.b/c") == "v1.2.3"
    assert required_version(text, "helm.sh/helm/v4") == "v4.2.3"
    assert required_version(text, "other") is None


def test_docs_name_the_helm_3_that_tools_helm_v3_builds() -> None:
    """docs/helm.md's table of tested Helm versions names the v3 that tools/helm/v3/go.mod pins."""
    pinned = required_version((ROOT / "tools" / "helm" / "v3" / "go.mod").read_text(), "helm.sh/helm/v3")
    assert pinned is not None, "tools/helm/v3/go.mod requires no helm.sh/helm/v3"
    rows = [
        line.split("|")
        for line in (ROOT / "docs" / "helm.md").read_text().splitlines()
        if line.startswith("| Helm 3 |")
    ]
    assert [row[2].strip() for row in rows] == [pinned]
