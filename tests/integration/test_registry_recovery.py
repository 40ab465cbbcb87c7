"""The recovery `gpu-operator status` recommends when the CRD hook Job cannot pull our image with
a wrong pull Secret (test_registry_install.py's simulator, registry and chart):

- the user fixes the Secret's content in place while `helm install` still waits: the kubelet's
  next pull (its back-off doubles from 10 s) uses it, the hook finishes and the install succeeds;
- `helm install` gave up first (its --timeout): the release is failed and helm deleted the hook's
  ServiceAccount and RBAC, so the Job left behind cannot finish by itself; after fixing the Secret,
  `helm upgrade --install` with the same release and values replaces that Job (the hook's
  before-hook-creation policy) and deploys the release."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from lightkube import ApiError, Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Secret, ServiceAccount

from gpu_operator.sim.plane.helm import helm_command
from gpu_operator.statusview.collect import operator_pods
from gpu_operator.statusview.operatorpods import operator_problems
from tests.integration import test_registry_install
from tests.integration.test_registry_install import HOOK, NAMESPACE, RELEASE, Site, _expected
from tests.integration.test_registry_pull import pull_secret
from tests.support.cleanup import delete_if_present
from tests.support.waiting import wait_for

FIXABLE = "registry-fixable-creds"  # wrong at first, then fixed in place under the same name
site = test_registry_install.site  # the namespace, Secrets, nodes and packaged chart, for this module too


@pytest.fixture
def fixable(site: Site, kube: Client) -> Iterator[str]:
    """The wrong Secret; afterwards the Secret is right (a test that failed early left it wrong)
    so that the uninstall cleanup hook can pull, and the release is uninstalled."""
    kube.create(
        pull_secret(FIXABLE, site.image.registry.docker_config(password="wrong")), namespace=NAMESPACE
    )
    try:
        yield FIXABLE
    finally:
        _fix_secret(site)
        if site.run_helm("status", RELEASE, "--namespace", NAMESPACE).returncode == 0:  # deployed or failed
            site.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "2m")
        delete_if_present(kube, Secret, FIXABLE, NAMESPACE)


def _helm_args(site: Site, verb: str, *extra: str) -> list[str]:
    """`helm install|upgrade --install` of the packaged chart with the fixable Secret."""
    return [
        helm_command(),
        *verb.split(),
        RELEASE,
        str(site.chart),
        "--namespace",
        NAMESPACE,
        "-f",
        str(site.values),
        "--set",
        f"operator.imagePullSecrets={{{FIXABLE}}}",
        *extra,
    ]


def _status_line(site: Site) -> str:
    """What status says of the hook pod, once it is the line the pod's state calls for."""
    shown, _ = wait_for(
        "status naming the hook pod's pull failure",
        lambda: (operator_problems(operator_pods(site.kube, NAMESPACE)), _expected(site, FIXABLE)),
        until=lambda pair: pair[1] and pair[0] == pair[1],
        timeout=60,
    )
    [line] = shown
    return line


def _release_status(site: Site) -> str:
    return str(
        json.loads(site.helm("status", RELEASE, "--namespace", NAMESPACE, "-o", "json"))["info"]["status"]
    )


def _fix_secret(site: Site) -> None:
    """`kubectl apply` of the same Secret with the right credentials."""
    secret = pull_secret(FIXABLE, site.image.registry.docker_config())
    assert secret.metadata is not None
    secret.metadata.namespace = NAMESPACE
    site.kube.replace(secret)


def _gone(kube: Client, resource: type[ServiceAccount] | type[Job], name: str) -> bool:
    try:
        kube.get(resource, name, namespace=NAMESPACE)
    except ApiError as err:
        if err.status.code == 404:
            return True
        raise
    return False


def test_a_secret_fixed_in_place_while_helm_waits_finishes_the_install(site: Site, fixable: str) -> None:
    helm = subprocess.Popen(
        _helm_args(site, "install", "--timeout", "3m"),
        env=site.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _status_line(site)
        t0 = time.monotonic()
        _fix_secret(site)
        out, err = helm.communicate(timeout=200)
    finally:
        if helm.poll() is None:
            helm.terminate()
            helm.communicate(timeout=30)
    site.figures["Secret fixed in place -> helm install done"] = time.monotonic() - t0
    assert helm.returncode == 0, err
    assert _release_status(site) == "deployed"
    assert _gone(site.kube, Job, HOOK)  # hook-succeeded


def test_after_helm_gave_up_helm_upgrade_install_recovers_the_release(site: Site, fixable: str) -> None:
    failed = subprocess.run(
        _helm_args(site, "install", "--timeout", "20s"),
        env=site.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert failed.returncode == 1, failed.stdout
    assert _release_status(site) == "failed"
    line = _status_line(site)
    # helm removed the hook's identity when it gave up: the Job it left cannot finish by itself
    assert _gone(site.kube, ServiceAccount, HOOK) and not _gone(site.kube, Job, HOOK)
    # what the line says: fix the Secret, then `helm upgrade --install RELEASE CHART --namespace NS`
    assert f"`helm upgrade --install {RELEASE} CHART --namespace {NAMESPACE}`" in line
    _fix_secret(site)
    t0 = time.monotonic()
    upgraded = subprocess.run(
        _helm_args(site, "upgrade --install", "--wait", "--timeout", "2m"),
        env=site.env(),
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    site.figures["helm upgrade --install after a failed install"] = time.monotonic() - t0
    assert upgraded.returncode == 0, upgraded.stderr
    assert _release_status(site) == "deployed"
    assert _gone(site.kube, Job, HOOK)
