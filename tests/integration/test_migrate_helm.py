"""The Helm steps of docs/migrate.md, run as the page writes them, with Helm 3, with Helm 4, and
with NVIDIA's release installed by Helm 3 and the steps run by Helm 4: taking the ClusterPolicy
(and the NVIDIADriver) out of NVIDIA's release keeping it (step 1), adopting it into a release of
our chart (step 2), and the roll-back: out of ours again and into NVIDIA's, the uids kept
throughout. Our chart's cleanup hook's Job is completed by kwok here (it deletes nothing); that
the block turns it off matters on a real cluster (docs/helm.md). The take-over by our operator is
tests/integration/test_takeover.py; no operator runs here.

NVIDIA's chart is not in this repository. A stand-in chart named `gpu-operator` (version
v26.7.0) is written at test time with only what the steps rely on, facts of NVIDIA's chart at
v26.7.0 (`deployments/gpu-operator/templates/clusterpolicy.yaml` and `values.yaml` there):

- the ClusterPolicy `cluster-policy` is a template, rendered when `clusterPolicy.deployCR` is true
  (its default);
- it carries `helm.sh/resource-policy: keep` only when `operator.cleanupCRD` is true (default
  false);
- its spec and labels: the recorded ClusterPolicy (tests/fixtures/nvidia-v26.7.0/policy.yaml,
  rendered from that chart with `nfd.enabled=false`);
- with `driver.nvidiaDriverCRD.enabled` and `.deployDefaultCR` (`templates/nvidiadriver.yaml`
  there; the second defaults to true) the NVIDIADriver `default`, without the `keep` annotation;
  the `nvidiadriver` case takes both objects' specs from the fixture recorded with that setting
  (tests/fixtures/nvidia-v26.7.0-nvidiadriver/policy.yaml) and runs the page's
  `kubectl annotate nvidiadriver` line ("only with deployDefaultCR"), the `clusterpolicy` case
  leaves that line out.

Nothing else of NVIDIA's chart is modelled (its operator, RBAC, NFD, hooks, CRDs: ours are
applied, same group, kinds and versions)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace

from gpu_operator.kube.client import ClusterPolicyResource, NVIDIADriverResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.helm import packaged_chart
from tests.support import docblocks, takeover
from tests.support import takeover_nvidiadriver as nvidiadriver_fixture
from tests.support.chart import helm_on_kwok
from tests.support.cleanup import delete_if_present
from tests.support.helm_cli import MAJORS, HelmCLI, HelmFailed
from tests.support.waiting import wait_for

PAGE = docblocks.ROOT / "docs" / "migrate.md"
RELEASE = "gpu-operator"  # the page's release name and namespace
PAGE_NAMESPACE = "gpu-operator"
OTHER = "gpu-operator-ours"
RELEASE_NAME, RELEASE_NAMESPACE = "meta.helm.sh/release-name", "meta.helm.sh/release-namespace"
MANAGED_BY = "app.kubernetes.io/managed-by"
KEEP = "helm.sh/resource-policy"

TEMPLATE = """\
{{- if .Values.clusterPolicy.deployCR }}
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata:
  name: cluster-policy
  labels:
{{ .Files.Get "labels.yaml" | indent 4 }}
  {{- if .Values.operator.cleanupCRD }}
  annotations:
    helm.sh/resource-policy: keep
  {{- end }}
spec:
{{ .Files.Get "spec.yaml" | indent 2 }}
{{- end }}
"""
NVIDIADRIVER_TEMPLATE = """\
{{- if and .Values.driver.nvidiaDriverCRD.enabled .Values.driver.nvidiaDriverCRD.deployDefaultCR }}
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata:
  name: default
spec:
{{ .Files.Get "driver-spec.yaml" | indent 2 }}
{{- end }}
"""
CASES = {"clusterpolicy": takeover.FIXTURE, "nvidiadriver": nvidiadriver_fixture.FIXTURE}


def stand_in_chart(target: Path, fixture: Path = takeover.FIXTURE) -> Path:
    """NVIDIA's chart as far as the steps need it (the module's docstring), its objects' specs
    from one recorded fixture."""
    docs = [d for d in yaml.safe_load_all((fixture / "policy.yaml").read_text()) if d]
    (recorded,) = [d for d in docs if d["kind"] == "ClusterPolicy"]
    drivers = [d for d in docs if d["kind"] == "NVIDIADriver"]
    labels = {k: v for k, v in recorded["metadata"]["labels"].items() if k != MANAGED_BY}  # Helm's own
    (target / "templates").mkdir(parents=True)
    (target / "Chart.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v2", "name": "gpu-operator", "version": "v26.7.0"})
    )
    values = {
        "clusterPolicy": {"deployCR": True},
        "operator": {"cleanupCRD": False},
        "driver": {"nvidiaDriverCRD": {"enabled": False, "deployDefaultCR": True}},
        "nfd": {"enabled": True},
    }
    (target / "values.yaml").write_text(yaml.safe_dump(values))
    (target / "labels.yaml").write_text(yaml.safe_dump(labels))
    (target / "spec.yaml").write_text(yaml.safe_dump(recorded["spec"]))
    (target / "templates" / "clusterpolicy.yaml").write_text(TEMPLATE)
    if drivers:
        (target / "driver-spec.yaml").write_text(yaml.safe_dump(drivers[0]["spec"]))
        (target / "templates" / "nvidiadriver.yaml").write_text(NVIDIADRIVER_TEMPLATE)
    return target


def step(contains: list[str]) -> list[list[str]]:
    """The simple commands of the docs/migrate.md command block that has a command starting with
    `contains`."""
    found = [
        [ws for command in block.commands() for ws in docblocks.simple_commands(command.text)]
        for block in docblocks.blocks(PAGE)
        if block.is_command_block
    ]
    (block,) = [b for b in found if any(ws[: len(contains)] == contains for ws in b)]
    return block


def as_run_here(ws: list[str], names: dict[str, str]) -> list[str]:
    """The page's words with its chart references and files replaced (`names`) and its namespace
    option left out (HelmCLI adds this test's namespace)."""
    out, i = [], 0
    while i < len(ws):
        if ws[i] in ("-n", "--namespace"):
            assert ws[i + 1] == PAGE_NAMESPACE, ws
            i += 2
            continue
        out.append(names.get(ws[i], ws[i]))
        i += 1
    return out


def kubectl(control_plane: ControlPlane, args: list[str]) -> None:
    binary = Path(sys.executable).parent / "kubectl"
    done = subprocess.run(
        [str(binary), *args, "--kubeconfig", str(control_plane.admin_kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl {args}: {done.stdout}{done.stderr}"


def run_step(
    commands: list[list[str]],
    helm: HelmCLI,
    control_plane: ControlPlane,
    names: dict[str, str],
    with_driver: bool = False,
) -> list[str]:
    """Every command of the block, as the page writes it; the command names run, in order. The
    NVIDIADriver's lines run only `with_driver` (the page: "only with deployDefaultCR")."""
    ran = []
    for ws in commands:
        if "nvidiadriver" in ws[:3] and not with_driver:
            continue
        args = as_run_here(ws, names)
        if ws[0] == "kubectl":
            kubectl(control_plane, args[1:])
        else:
            assert ws[0] == "helm", ws
            helm.run(*args[1:])
        ran.append(" ".join(ws[:2]))
    return ran


def policy(
    kube: Client, resource: Any = ClusterPolicyResource, name: str = "cluster-policy"
) -> dict[str, Any] | None:
    try:
        found = dict(kube.get(resource, name))
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise
    return found


IMPORT_REFUSED = re.compile(
    r'(?P<kind>\w+) "(?P<name>[^"]+)" in namespace "(?P<namespace>[^"]*)" exists and cannot be '
    r"imported into the current release: invalid ownership metadata; (?P<errors>.*)$"
)
VALIDATION = re.compile(
    r'(?P<what>label|annotation) validation error: key "(?P<key>[^"]+)" must equal "(?P<want>[^"]*)": '
    r'current value is "(?P<have>[^"]*)"'
)


def import_refusal(message: str) -> tuple[tuple[str, str, str], list[tuple[str, str, str, str]]]:
    """Helm's refusal to take an existing object into a release, read into its fields: the object
    (kind, name, namespace) and each failed check (label or annotation, key, wanted, found). Helm
    gives no structured error; its message is built from fixed formats in `pkg/action/validate.go`
    (`existingResourceConflict`, `checkOwnership`, `requireValue`), the same in Helm v3.22.0 and
    v4.2.3, which these patterns spell."""
    (line,) = [m for m in map(IMPORT_REFUSED.search, message.splitlines()) if m]
    checks = [VALIDATION.fullmatch(e) for e in line["errors"].split("; ")]
    assert all(checks), line["errors"]
    return (line["kind"], line["name"], line["namespace"]), [
        (c["what"], c["key"], c["want"], c["have"]) for c in checks if c
    ]


# (the helm that installed NVIDIA's release, the helm the page's steps run with): the same major,
# or a user whose NVIDIA release was installed with Helm 3 and who now runs Helm 4.
HELMS = [*((m, m) for m in MAJORS), (3, 4)]


@dataclass
class Helms:
    nvidias: HelmCLI  # installed NVIDIA's release
    helm: HelmCLI  # runs the page's steps


@pytest.fixture(params=HELMS, ids=lambda p: f"helm{p[0]}" if p[0] == p[1] else f"helm{p[0]}-then-{p[1]}")
def helms(
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    kube: Client,
    crds: list[str],
    fake_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> Iterator[Helms]:
    fake_nodes("cpu:1")  # kwok completes our chart's hook Jobs' pods there
    first, then = request.param
    case = request.node.callspec.params["case"]
    namespace = f"gpu-operator-migrate-{first}{then}-{case}"  # one each: another's may still be going
    with helm_on_kwok(then, control_plane, kube, namespace, tmp_path / "helm") as cli:
        nvidias = (
            cli
            if first == then
            else HelmCLI(first, control_plane.admin_kubeconfig, namespace, tmp_path / "helm-first")
        )
        try:
            yield Helms(nvidias, cli)
        finally:
            for release in cli.releases():
                cli.uninstall(release)
            delete_if_present(kube, ClusterPolicyResource, "cluster-policy")
            delete_if_present(kube, NVIDIADriverResource, "default")
            delete_if_present(kube, Namespace, namespace)


def driver(kube: Client) -> dict[str, Any] | None:
    return policy(kube, NVIDIADriverResource, "default")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_pages_helm_steps_keep_the_cluster_policy_and_ours_adopts_it(
    case: str, helms: Helms, control_plane: ControlPlane, kube: Client, tmp_path: Path
) -> None:
    helm = helms.helm
    nvidia = stand_in_chart(tmp_path / "nvidia" / "gpu-operator", CASES[case])
    with_driver = case == "nvidiadriver"
    install_values: dict[str, Any] = {"nfd": {"enabled": False}}  # as the fixtures were rendered
    if with_driver:
        install_values["driver"] = {"nvidiaDriverCRD": {"enabled": True}}

    # Without the steps: NVIDIA's `helm uninstall` deletes the ClusterPolicy (what the page warns of).
    helms.nvidias.install(nvidia, RELEASE, install_values)
    first = policy(kube)
    assert first is not None and KEEP not in first["metadata"].get("annotations", {})
    helms.nvidias.uninstall(RELEASE)
    wait_for("the ClusterPolicy deleted", lambda: policy(kube), until=lambda p: p is None, timeout=30)
    wait_for("the NVIDIADriver deleted", lambda: driver(kube), until=lambda d: d is None, timeout=30)

    # Step 1, as the page writes it.
    helms.nvidias.install(nvidia, RELEASE, install_values)
    installed = policy(kube)
    assert installed is not None
    uid = installed["metadata"]["uid"]
    nvd = driver(kube)
    assert (nvd is not None) == with_driver, nvd
    your_values = tmp_path / "your-values.yaml"  # step 2: the values of NVIDIA's release, read before step 1
    your_values.write_text(helm.run("get", "values", RELEASE, "--output", "yaml"))
    names = {"nvidia/gpu-operator": str(nvidia)}
    ran = run_step(
        step(["helm", "upgrade", RELEASE, "nvidia/gpu-operator"]), helm, control_plane, names, with_driver
    )
    assert RELEASE not in helm.releases()
    kept = policy(kube)
    assert kept is not None, "step 1 deleted the ClusterPolicy"
    assert kept["metadata"]["uid"] == uid
    assert kept["metadata"]["annotations"][KEEP] == "keep"
    assert kept["spec"] == installed["spec"]
    assert ran == [
        "kubectl annotate",
        *(["kubectl annotate"] if with_driver else []),
        "helm upgrade",
        "helm uninstall",
    ]
    if nvd is not None:
        kept_driver = driver(kube)
        assert kept_driver is not None, "step 1 deleted the NVIDIADriver"
        assert kept_driver["metadata"]["uid"] == nvd["metadata"]["uid"]
        assert kept_driver["metadata"]["annotations"][KEEP] == "keep"

    # Step 2 under another release name: Helm refuses to take the kept ClusterPolicy.
    ours = packaged_chart(tmp_path / "chart")
    with pytest.raises(HelmFailed) as refused:
        helm.run("install", OTHER, str(ours), "-f", str(your_values))
    assert import_refusal(str(refused.value)) == (
        ("ClusterPolicy", "cluster-policy", ""),
        [("annotation", RELEASE_NAME, OTHER, RELEASE)],
    )
    assert OTHER not in helm.releases()
    untouched = policy(kube)
    assert (
        untouched is not None
        and untouched["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
    )

    # Step 2, as the page writes it: the same release name and namespace adopt it.
    names = {"deployments/gpu-operator": str(ours), "your-values.yaml": str(your_values)}
    assert run_step(
        step(["helm", "install", RELEASE, "deployments/gpu-operator"]), helm, control_plane, names
    ) == ["helm install"]
    adopted = policy(kube)
    assert adopted is not None
    assert adopted["metadata"]["uid"] == uid
    assert adopted["metadata"]["annotations"][RELEASE_NAME] == RELEASE
    assert adopted["metadata"]["annotations"][RELEASE_NAMESPACE] == helm.namespace
    assert adopted["metadata"]["labels"][MANAGED_BY] == "Helm"
    manifest = [d for d in yaml.safe_load_all(helm.run("get", "manifest", RELEASE)) if d]
    assert [d["metadata"]["name"] for d in manifest if d["kind"] == "ClusterPolicy"] == ["cluster-policy"]
    if nvd is not None:  # the NVIDIADriver adopted as well, with its uid
        adopted_driver = driver(kube)
        assert adopted_driver is not None and adopted_driver["metadata"]["uid"] == nvd["metadata"]["uid"]
        assert adopted_driver["metadata"]["annotations"][RELEASE_NAMESPACE] == helm.namespace
        assert [d["metadata"]["name"] for d in manifest if d["kind"] == "NVIDIADriver"] == ["default"]
    assert [(h["revision"], h["status"]) for h in helm.history(RELEASE)] == [(1, "deployed")]

    # And back (the page's roll-back block): the CRs kept out of our release, NVIDIA's release
    # (the stand-in, with the values of NVIDIA's release saved before step 1) adopts them.
    names = {
        "deployments/gpu-operator": str(ours),
        "nvidia/gpu-operator": str(nvidia),
        "nvidia-values.yaml": str(your_values),
    }
    ran = run_step(
        step(["helm", "upgrade", RELEASE, "deployments/gpu-operator"]),
        helm,
        control_plane,
        names,
        with_driver,
    )
    assert ran == [
        "kubectl annotate",
        *(["kubectl annotate"] if with_driver else []),
        "helm upgrade",
        "helm uninstall",
        "helm install",
    ]
    back = policy(kube)
    assert back is not None and back["metadata"]["uid"] == uid, "the roll-back lost the ClusterPolicy"
    manifest = [d for d in yaml.safe_load_all(helm.run("get", "manifest", RELEASE)) if d]
    kinds = sorted(d["kind"] for d in manifest)
    assert kinds == sorted(["ClusterPolicy", *(["NVIDIADriver"] if with_driver else [])]), kinds
    if nvd is not None:
        back_driver = driver(kube)
        assert back_driver is not None and back_driver["metadata"]["uid"] == nvd["metadata"]["uid"]
