"""`helm install` as users do it, from a registry: the chart as an OCI artifact (`helm registry
login`, `helm push`, `helm install oci://...`) and from a classic chart repository over HTTPS
(`helm repo add`, `helm install REPO/gpu-operator`), with our operator image pulled by the real
node from the simulator's registry with the pull Secret named in operator.imagePullSecrets. Each
way brings the ClusterPolicy to ready; a wrong Secret leaves the CRD hook pod unable to pull, and
`gpu-operator status` names the Secret, its values key and the registry.

The helm command line is the one users run ($GPU_OPERATOR_HELM), with its own config, cache and
registry login under the test's directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

from gpu_operator import __version__
from gpu_operator.sim.plane import nodes
from gpu_operator.sim.plane.chartrepo import ChartRepo
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.helm import helm_command, merge, packaged_chart, real_node_values
from gpu_operator.statusview.collect import collect
from gpu_operator.statusview.operatorpods import IMAGE_REASONS
from tests.integration.realnode_fixtures import REAL_NODE, api_log
from tests.integration.registry_fixtures import PushedImage
from tests.integration.test_registry_pull import pull_secret
from tests.support.cleanup import delete_if_present
from tests.support.gpgkey import make_key
from tests.support.status import policy_status
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "gpu-operator-registry"
RELEASE = "gpu-operator"
SECRET = "registry-creds"
WRONG = "registry-wrong-creds"
HOOK = "gpu-operator-crds"  # the CRD hook's Job, ServiceAccount, ClusterRole and binding
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}


@dataclass
class Site:
    plane: ControlPlane
    kube: Client
    image: PushedImage
    home: Path
    chart: Path
    values: Path
    figures: dict[str, float] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """helm's environment: the simulator's kubeconfig, its own config, cache and registry login."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.plane.admin_kubeconfig),
            **{f"HELM_{k}_HOME": str(self.home / k.lower()) for k in ("CONFIG", "CACHE", "DATA")},
        }

    def run_helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [helm_command(), *args], capture_output=True, text=True, env=self.env(), timeout=120, check=False
        )

    def helm(self, *args: str, stdin: str | None = None, timeout: float = 360) -> str:
        done = subprocess.run(
            [helm_command(), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, (
            f"helm {' '.join(args)} exited {done.returncode}: {done.stderr}\n{self.pods()}"
        )
        return done.stdout

    def pods(self) -> str:
        """The namespace's pods, their container states and last log lines (for a failure's message)."""
        out = []
        for pod in self.kube.list(Pod, namespace=NAMESPACE):
            name = pod.metadata.name if pod.metadata else ""
            states = [(c.name, c.state) for c in (pod.status.containerStatuses or [])] if pod.status else []
            logs = "\n".join(api_log(self.plane, NAMESPACE, str(name), states[0][0])[-15:]) if states else ""
            out.append(f"pod {name}: {states}\n{logs}")
        return "\n".join(out)

    @property
    def ca(self) -> str:
        return str(self.image.registry.ca_cert)

    def install_ready(self, way: str, chart: str, *extra: str) -> None:
        """helm install CHART --wait, the ClusterPolicy ready, the operator pod's image pulled from the
        registry with the Secret; then helm uninstall."""
        seen = len(self.image.registry.requests())
        t0 = time.monotonic()
        self.helm(
            "install",
            RELEASE,
            chart,
            "--version",
            __version__,
            "--namespace",
            NAMESPACE,
            "-f",
            str(self.values),
            "--wait",
            "--timeout",
            "5m",
            *extra,
        )
        wait_for(
            f"the ClusterPolicy ready (installed from {way})",
            lambda: policy_status(self.kube),
            until=lambda s: s.get("state") == "ready",
            timeout=240,
        )
        self.figures[f"install from {way} -> ready"] = time.monotonic() - t0
        [pod] = [p for p in self.kube.list(Pod, namespace=NAMESPACE, labels={"app": "gpu-operator"})]
        assert pod.spec is not None and pod.spec.nodeName == REAL_NODE
        assert pod.spec.containers[0].image == f"{self.image.repository}/gpu-operator:{__version__}"
        assert [s.name for s in pod.spec.imagePullSecrets or []] == [SECRET]
        manifest = f"/v2/{self.image.ref.split('/', 1)[1].rsplit(':', 1)[0]}/manifests/{__version__}"
        pulls = [
            r
            for r in self.image.registry.requests()[seen:]
            if r["path"] == manifest and r["status"] == "200" and r["user"] == self.image.registry.user
        ]
        assert pulls, (
            f"the node did not pull {manifest} from the registry: {self.image.registry.requests()[seen:]}"
        )
        t0 = time.monotonic()
        self.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m")
        wait_for(
            "the ClusterPolicy gone", lambda: policy_status(self.kube), until=lambda s: s == {}, timeout=120
        )
        self.figures[f"uninstall ({way})"] = time.monotonic() - t0


def _expected(site: Site, secret: str = WRONG) -> list[str]:
    """The line status should show for the CRD hook's pod as it is now (its waiting reason read from
    the pod; nothing while it is not waiting on its image)."""
    pods = [
        p
        for p in site.kube.list(Pod, namespace=NAMESPACE)
        if p.metadata and p.metadata.labels and p.metadata.labels.get("app.kubernetes.io/component") == "crds"
    ]
    if len(pods) != 1 or pods[0].status is None or pods[0].spec is None or pods[0].metadata is None:
        return []
    pod, states = pods[0], pods[0].status.containerStatuses or []
    waiting = states[0].state.waiting if states and states[0].state else None
    if waiting is None or waiting.reason not in IMAGE_REASONS:
        return []
    host, image = site.image.registry.host, pod.spec.containers[0].image
    return [
        f"the CRD hook Job (helm install/upgrade waits for it): pod {NAMESPACE}/{pod.metadata.name} cannot pull "
        f"image {image!r} ({waiting.reason}); it pulls with the Secret {secret} (operator.imagePullSecrets): check "
        f"that it holds valid credentials for {host}; the chart builds it from operator.repository, operator.image "
        "and operator.version (operator.imagePullSecrets for a private registry): a Secret fixed in place (same "
        "name) is used at the kubelet's next pull, within 300 s, while helm still waits; once helm has failed, run "
        f"`helm upgrade --install {RELEASE} CHART --namespace {NAMESPACE}` with the fixed values, or "
        "`helm uninstall --no-hooks` and `gpu-operator cleanup` to give the release up"
    ]


def _values(image: PushedImage, secret: str) -> dict[str, Any]:
    """The simulator's real-node values, the operator image from the registry with its Secret."""
    return merge(
        real_node_values(REAL_NODE, "/run/gpu-operator-sim-no-host"),
        {
            "operator": {
                "repository": image.repository,
                "imagePullSecrets": [secret],
                # pulled even when the node holds the image already
                "imagePullPolicy": "Always",
            }
        },
    )


def _namespace_gone(kube: Client) -> bool:
    try:
        kube.get(Namespace, NAMESPACE)
    except ApiError as err:
        if err.status.code == 404:
            return True
        raise
    return False


@pytest.fixture(scope="module")
def site(
    control_plane: ControlPlane,
    kube: Client,
    registry_image: PushedImage,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Site]:
    base = Path(tmp_path_factory.mktemp("registry-install"))
    # another module's site (test_registry_recovery takes this fixture too) may still be deleting it
    wait_for(
        f"namespace {NAMESPACE} of an earlier module to be gone",
        lambda: _namespace_gone(kube),
        timeout=180,
        interval=1,
    )
    kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE, labels=RESTRICTED)))
    registry = registry_image.registry
    kube.create(pull_secret(SECRET, registry.docker_config()), namespace=NAMESPACE)
    kube.create(pull_secret(WRONG, registry.docker_config(password="not-the-password")), namespace=NAMESPACE)
    gpu_nodes = nodes.add_nodes(kube, ["dgx-h100:2"], start=9300)
    nodes.wait_ready(kube, gpu_nodes)
    values = base / "values.yaml"
    values.write_text(yaml.safe_dump(_values(registry_image, SECRET)))
    site = Site(control_plane, kube, registry_image, base / "helm", packaged_chart(base / "repo"), values)
    helm_python.repo_index_generate(base / "repo")  # index.yaml next to the archive, as ./dev chart leaves it
    # the chart as an OCI artifact in the registry
    site.helm(
        "registry",
        "login",
        registry.host,
        "--username",
        registry.user,
        "--password-stdin",
        "--ca-file",
        site.ca,
        stdin=registry.password,
    )
    site.helm("push", str(site.chart), f"oci://{registry.host}/charts", "--ca-file", site.ca)
    try:
        yield site
    finally:
        with_release = site.helm("list", "--namespace", NAMESPACE, "--short")
        if RELEASE in with_release.split():
            site.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks", "--wait")
        # what the CRD hook left when its pod could not pull (hooks are no part of the release)
        delete_if_present(kube, ClusterRoleBinding, HOOK)
        delete_if_present(kube, ClusterRole, HOOK)
        delete_if_present(kube, Namespace, NAMESPACE)
        nodes.remove_nodes(kube, gpu_nodes)
        print("\nhelm from a registry: " + ", ".join(f"{k} {v:.1f} s" for k, v in site.figures.items()))


def test_helm_install_from_oci_and_from_a_chart_repository(site: Site) -> None:
    registry = site.image.registry
    site.install_ready("OCI", f"oci://{registry.host}/charts/gpu-operator", "--ca-file", site.ca)

    with ChartRepo(site.chart.parent, registry.pki_dir) as repo:
        site.helm("repo", "add", "gpu-operator-sim", repo.url, "--ca-file", site.ca)
        site.install_ready("a chart repository", "gpu-operator-sim/gpu-operator")


def test_a_wrong_pull_secret_is_named_by_status(site: Site) -> None:
    """The hook Job's pod cannot pull with the wrong Secret: helm waits on it; status says which
    Secret, which values key and which registry. Then the release is removed without its hooks."""
    registry = site.image.registry
    helm = subprocess.Popen(
        [
            helm_command(),
            "install",
            RELEASE,
            f"oci://{registry.host}/charts/gpu-operator",
            "--version",
            __version__,
            "--ca-file",
            site.ca,
            "--namespace",
            NAMESPACE,
            "-f",
            str(site.values),
            "--set",
            f"operator.imagePullSecrets={{{WRONG}}}",
            "--timeout",
            "3m",
        ],
        env=site.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        shown, expected = wait_for(
            "status naming the CRD hook pod's pull failure",
            lambda: (collect(site.kube, NAMESPACE).operator, _expected(site)),
            until=lambda pair: pair[1] and pair[0] == pair[1],
            timeout=90,
            context=lambda: collect(site.kube, NAMESPACE).operator,
        )
    finally:
        helm.terminate()
        helm.communicate(timeout=30)
    assert len(shown) == 1, shown
    assert any(r["user"] == registry.user and r["status"] == "401" for r in registry.requests())


def test_a_signed_release_verifies_from_oci_and_the_chart_repository(site: Site, tmp_path: Path) -> None:
    """`./dev chart --sign` and tools/chart/push.sh (what `./dev release` chains): `helm pull --verify`
    (the check `helm install --verify` makes) accepts the signed chart from the registry and from a
    chart repository serving the release directory; the unsigned chart and another signer's keyring
    are refused with Helm's messages."""
    ours, other = (
        make_key(tmp_path / "ours", "gpu-operator release"),
        make_key(tmp_path / "other", "someone else"),
    )
    charts, registry = tmp_path / "charts", site.image.registry
    subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "chart" / "release.py"),
            "--out",
            str(charts),
            "--sign",
            ours.name,
            "--keyring",
            str(ours.secring),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    creds = tmp_path / "creds"
    creds.write_text(f"{registry.user}:{registry.password}")
    pushed = subprocess.run(
        [
            str(REPO / "tools" / "chart" / "push.sh"),
            f"{registry.host}/signed",
            "--ca-file",
            site.ca,
            "--creds-file",
            str(creds),
            "--charts",
            str(charts),
        ],
        env=site.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.splitlines() == [f"oci://{registry.host}/signed/charts/gpu-operator"]
    digest = helm_python.digest(charts / f"gpu-operator-{__version__}.tgz")

    def pull(chart: str, keyring: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        out = tmp_path / "pulled"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        return site.run_helm(
            "pull",
            chart,
            "--version",
            __version__,
            "--verify",
            "--keyring",
            str(keyring),
            "--destination",
            str(out),
            *extra,
        )

    signed = pull(f"oci://{registry.host}/signed/charts/gpu-operator", ours.pubring, "--ca-file", site.ca)
    assert signed.returncode == 0, signed.stderr
    assert f"Chart Hash Verified: {digest}" in signed.stdout.splitlines()
    unsigned = pull(f"oci://{registry.host}/charts/gpu-operator", ours.pubring, "--ca-file", site.ca)
    assert unsigned.returncode == 1
    assert unsigned.stderr.splitlines()[-1] == (
        f'Error: failed to fetch provenance "oci://{registry.host}/charts/gpu-operator:{__version__}.prov"'
    )
    foreign = pull(f"oci://{registry.host}/signed/charts/gpu-operator", other.pubring, "--ca-file", site.ca)
    assert foreign.returncode == 1
    assert foreign.stderr.splitlines()[-1] == "Error: openpgp: signature made by unknown entity"

    with ChartRepo(charts, registry.pki_dir) as repo:
        site.helm("repo", "add", "signed-release", repo.url, "--ca-file", site.ca)
        from_repo = pull("signed-release/gpu-operator", ours.pubring)
    assert from_repo.returncode == 0, from_repo.stderr
    assert f"Chart Hash Verified: {digest}" in from_repo.stdout.splitlines()
