"""checkov (a scanner no one here wrote, pinned in tools/checkov/requirements.txt) over every render of
the chart (default values and each preset) and of the operator (each example policy on dgx-h100:2 and
the GPUCluster): every finding must be listed, by object and check, with its reason, in
tools/checkov/allowlist.yaml, and every listed entry must still be found. The comparison with NVIDIA's
v26.7.0 is in docs/security.md ("Measured by checkov").

checkov runs from its own virtualenv (tools/checkov/build.sh, installed on first use: ~3 min cold);
one checkov run over all renders takes ~1 min on two cores.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from tools.checkov import scan

ROOT = Path(__file__).resolve().parents[3]
ALLOWLIST = ROOT / "tools" / "checkov" / "allowlist.yaml"
CHECK_ID = re.compile(r"CKV2?_K8S_\d+")
RESOURCE = re.compile(r"[A-Z][A-Za-z]+/[a-z0-9][a-z0-9-]*")


@cache
def renders() -> dict[str, list[dict[str, Any]]]:
    return scan.our_renders()


@cache
def findings() -> tuple[scan.Finding, ...]:
    return tuple(scan.run_checkov(renders()))


def allowlist() -> dict[str, dict[str, str]]:
    data: dict[str, dict[str, str]] = yaml.safe_load(ALLOWLIST.read_text())
    return data


def test_every_render_is_scanned() -> None:
    assert sorted(renders()) == sorted(
        [
            *(f"chart-{p}" for p in scan.PRESETS),
            *(f"operands-{p}" for p in scan.PRESETS),
            "operands-gpucluster",
        ]
    )
    for name, objects in renders().items():
        assert any(o["kind"] in ("DaemonSet", "Deployment") for o in objects), name
    assert {f.render for f in findings()} == set(renders())  # checkov read every folder


def test_every_finding_is_allowlisted_with_its_reason() -> None:
    listed = allowlist()
    missing = sorted(
        {
            f"{f.render}: {f.check} on {f.resource}"
            for f in findings()
            if f.check not in listed.get(f.resource, {})
        }
    )
    assert missing == [], "findings not in tools/checkov/allowlist.yaml:\n" + "\n".join(missing)


def test_every_allowlist_entry_is_still_found() -> None:
    found = {(f.resource, f.check) for f in findings()}
    stale = sorted(
        f"{resource} {check}"
        for resource, checks in allowlist().items()
        for check in checks
        if (resource, check) not in found
    )
    assert stale == [], "entries no render produces any more (remove them):\n" + "\n".join(stale)


def test_entries_name_one_object_and_one_check_each_with_a_reason() -> None:
    for resource, checks in allowlist().items():
        assert RESOURCE.fullmatch(resource), f"{resource}: KIND/NAME, no pattern"
        for check, why in checks.items():
            assert CHECK_ID.fullmatch(check), f"{resource}: {check} is not a checkov Kubernetes check id"
            assert isinstance(why, str) and len(why.split()) >= 5, f"{resource} {check}: say why"


def test_a_regression_is_found() -> None:
    """Undo hardening on one render (a token in DCGM's pod, no limits on the device plugin): checkov
    must report both as findings the allowlist does not hold."""
    objects = copy.deepcopy(renders()["operands-default"])
    for o in objects:
        pod = o.get("spec", {}).get("template", {}).get("spec", {})
        if o["metadata"]["name"] == "nvidia-dcgm" and o["kind"] == "DaemonSet":
            pod.pop("automountServiceAccountToken")
        if o["metadata"]["name"] == "nvidia-device-plugin-daemonset" and o["kind"] == "DaemonSet":
            for ctr in pod["containers"]:
                ctr["resources"].pop("limits")
    listed = allowlist()
    new = {
        (f.check, f.resource)
        for f in scan.run_checkov({"operands-default": objects})
        if f.check not in listed.get(f.resource, {})
    }
    assert new == {
        ("CKV_K8S_38", "DaemonSet/nvidia-dcgm"),
        ("CKV_K8S_11", "DaemonSet/nvidia-device-plugin-daemonset"),
        ("CKV_K8S_13", "DaemonSet/nvidia-device-plugin-daemonset"),
    }
