"""Table tests, one table per shared transform."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api.clusterpolicy import ClusterPolicy, ClusterPolicySpec
from gpu_operator.api.common import ComponentFields, ImageFields
from gpu_operator.render import RenderError
from gpu_operator.render.facts import NodeFacts
from gpu_operator.render.objects import container, env
from gpu_operator.render.transforms.component import apply_component, host_network, pull_secrets
from gpu_operator.render.transforms.config_manager import config_manager
from gpu_operator.render.transforms.daemonset import common_config, driver_install_dir, host_root
from gpu_operator.render.transforms.driver import driver_image, precompiled_name, sanitize_kernel
from gpu_operator.render.transforms.image import image_path, pull_policy, with_os_tag
from tests.unit.render.renderkit import ctr, daemonset, env_of, run

DIGEST = "sha256:" + "ab" * 32  # a digest of the real length


def spec(data: dict[str, Any]) -> ClusterPolicySpec:
    return ClusterPolicy.model_validate({"spec": data}).spec


def ds_with(*containers: dict[str, Any], **pod: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "x", "labels": {}},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {"containers": list(containers), **pod},
            }
        },
    }


@pytest.mark.parametrize(
    ("fields", "env_vars", "expected"),
    [
        ({"repository": "r", "image": "i", "version": "1"}, {}, "r/i:1"),
        ({"repository": "r", "image": "i", "version": DIGEST}, {}, f"r/i@{DIGEST}"),
        ({"image": "full/ref:tag"}, {}, "full/ref:tag"),
        ({"image": "i", "version": "1"}, {"X_IMAGE": "env/x:2"}, "env/x:2"),
        ({}, {"X_IMAGE": "env/x:2"}, "env/x:2"),
        (None, {"X_IMAGE": "env/x:2"}, "env/x:2"),
    ],
)
def test_image_path(fields: dict[str, str] | None, env_vars: dict[str, str], expected: str) -> None:
    model = ImageFields.model_validate(fields) if fields is not None else None
    assert image_path(model, "X_IMAGE", env_vars, "spec.x") == expected


def test_image_path_without_any_source_names_field_and_env() -> None:
    with pytest.raises(RenderError, match=r"spec\.x: .*X_IMAGE"):
        image_path(ImageFields(repository="r"), "X_IMAGE", {}, "spec.x")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Always", "Always"),
        ("Never", "Never"),
        ("IfNotPresent", "IfNotPresent"),
        ("always", "IfNotPresent"),
        (None, "IfNotPresent"),
        ("", "IfNotPresent"),
    ],
)
def test_pull_policy(value: str | None, expected: str) -> None:
    assert pull_policy(value) == expected


@pytest.mark.parametrize(
    ("image", "os_tag", "kernel", "expected"),
    [
        ("r/driver:595", "ubuntu22.04", None, "r/driver:595-ubuntu22.04"),
        (f"r/driver@{DIGEST}", "ubuntu22.04", None, f"r/driver@{DIGEST}"),
        ("r/driver:595", "", None, "r/driver:595"),
        ("r/driver:595", "rhel9", "5.14.0-427.el9.x86_64", "r/driver:595-5.14.0-427.el9.x86_64-rhel9"),
    ],
)
def test_driver_image(image: str, os_tag: str, kernel: str | None, expected: str) -> None:
    assert driver_image(image, os_tag, kernel) == expected
    if kernel is None:
        assert with_os_tag(image, os_tag) == expected


@pytest.mark.parametrize(
    ("kernel", "expected"),
    [
        ("5.15.0-119-generic", "5.15.0-119-generic"),
        ("5.14.0-427.13.1.el9_4.x86_64", "5.14.0-427.13.1.el9.4"),
        ("6.1.0-AWS.aarch64", "6.1.0-aws"),
        ("5.14.0-1.el9.aarch64_64k", "5.14.0-1.el9"),
    ],
)
def test_sanitize_kernel(kernel: str, expected: str) -> None:
    assert sanitize_kernel(kernel) == expected
    assert precompiled_name(kernel, "rhel9") == f"nvidia-driver-daemonset-{expected}-rhel9"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (
            {
                "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
                "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
            },
            "ubuntu22.04",
        ),
        (
            {
                "feature.node.kubernetes.io/system-os_release.ID": "rhel",
                "feature.node.kubernetes.io/system-os_release.VERSION_ID": "9.4",
            },
            "rhel9",
        ),
        (
            {
                "feature.node.kubernetes.io/system-os_release.ID": "rocky",
                "feature.node.kubernetes.io/system-os_release.VERSION_ID": "8.10",
            },
            "rocky8",
        ),
        ({}, ""),
    ],
)
def test_os_tag(labels: dict[str, str], expected: str) -> None:
    assert NodeFacts("n", labels).os_tag == expected


@pytest.mark.parametrize(
    ("data", "kept"), [({}, False), ({"devicePlugin": {"config": {"name": "cfg", "default": "a"}}}, True)]
)
def test_config_manager(data: dict[str, Any], kept: bool) -> None:
    pod: dict[str, Any] = {
        "initContainers": [container("config-manager-init")],
        "containers": [container("main"), container("config-manager")],
    }
    config_manager(pod, spec(data), "img:1")
    names = [c["name"] for c in [*pod.get("initContainers", []), *pod["containers"]]]
    if not kept:
        assert names == ["main"] and "volumes" not in pod
        return
    assert names == ["config-manager-init", "main", "config-manager"]
    assert env_of(pod["containers"][0])["CONFIG_FILE"] == "/config/config.yaml"
    sidecar = pod["containers"][1]
    assert sidecar["image"] == "img:1" and env_of(sidecar)["DEFAULT_CONFIG"] == "a"
    assert {v["name"] for v in pod["volumes"]} == {"cfg", "config"}
    assert pod["shareProcessNamespace"] is True


@pytest.mark.parametrize(
    ("data", "strategy", "priority", "tolerations"),
    [
        ({}, {"type": "RollingUpdate"}, "system-node-critical", 2),
        ({"daemonsets": {"updateStrategy": "OnDelete"}}, {"type": "OnDelete"}, "system-node-critical", 2),
        (
            {
                "daemonsets": {
                    "rollingUpdate": {"maxUnavailable": "3"},
                    "priorityClassName": "p",
                    "tolerations": [{"operator": "Exists"}, {"key": "k", "operator": "Exists"}],
                }
            },
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 3}},
            "p",
            2,
        ),
        (
            {"daemonsets": {"rollingUpdate": {"maxUnavailable": "25%"}}},
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
            "system-node-critical",
            2,
        ),
    ],
)
def test_common_config(
    data: dict[str, Any], strategy: dict[str, Any], priority: str, tolerations: int
) -> None:
    ds = ds_with(container("a"))
    common_config(ds, spec(data))
    assert ds["spec"]["updateStrategy"] == strategy
    assert ds["spec"]["template"]["spec"]["priorityClassName"] == priority
    assert len(ds["spec"]["template"]["spec"]["tolerations"]) == tolerations


def test_every_daemonset_tolerates_the_gpu_health_quarantine() -> None:
    """The operands stay on (and come back to) a quarantined node: the default tolerations and a
    policy's own get the health taint's; a toleration of every taint needs none."""
    from gpu_operator.vocabulary import HEALTH_TAINT

    for data, want in (
        (
            {},
            [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": HEALTH_TAINT, "operator": "Exists"},
            ],
        ),
        (
            {"daemonsets": {"tolerations": [{"key": "pool", "operator": "Exists"}]}},
            [{"key": "pool", "operator": "Exists"}, {"key": HEALTH_TAINT, "operator": "Exists"}],
        ),
        ({"daemonsets": {"tolerations": [{"operator": "Exists"}]}}, [{"operator": "Exists"}]),
    ):
        ds = ds_with(container("a"))
        common_config(ds, spec(data))
        assert ds["spec"]["template"]["spec"]["tolerations"] == want


def test_common_config_labels_never_override_app() -> None:
    ds = ds_with(container("a"))
    common_config(
        ds, spec({"daemonsets": {"labels": {"app": "evil", "team": "t"}, "annotations": {"n": "v"}}})
    )
    assert ds["spec"]["template"]["metadata"]["labels"] == {"app": "x", "team": "t"}
    assert ds["spec"]["template"]["metadata"]["annotations"] == {"n": "v"}


@pytest.mark.parametrize(
    ("root", "root_path", "char_path", "env_set"),
    [("/", "/", "/dev/char", False), ("/custom", "/custom", "/custom/dev/char", True)],
)
def test_host_root(root: str, root_path: str, char_path: str, env_set: bool) -> None:
    ds = ds_with(
        container("a"),
        volumes=[
            {"name": "host-root", "hostPath": {"path": "/"}},
            {"name": "host-dev-char", "hostPath": {"path": "/dev/char"}},
        ],
    )
    host_root(ds, root)
    vols = {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert vols == {"host-root": root_path, "host-dev-char": char_path}
    assert ("HOST_ROOT" in env_of(ds["spec"]["template"]["spec"]["containers"][0])) == env_set


def test_driver_install_dir() -> None:
    validation = container(
        "driver-validation", mounts=[{"name": "driver-install-dir", "mountPath": "/run/nvidia/driver"}]
    )
    ds = ds_with(
        container("a"),
        initContainers=[validation],
        volumes=[{"name": "driver-install-dir", "hostPath": {"path": "/run/nvidia/driver"}}],
    )
    driver_install_dir(ds, "/opt/driver")
    assert ds["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] == "/opt/driver"
    assert validation["volumeMounts"][0]["mountPath"] == "/opt/driver"
    assert env_of(validation) == {
        "DRIVER_INSTALL_DIR": "/opt/driver",
        "DRIVER_INSTALL_DIR_CTR_PATH": "/opt/driver",
    }


def test_component_block() -> None:
    fields = ComponentFields.model_validate(
        {
            "imagePullSecrets": ["s1", "s1", "s2"],
            "resources": {"limits": {"cpu": 1}},
            "args": ["--v"],
            "env": [{"name": "A", "value": "new"}],
            "hostNetwork": True,
        }
    )
    main = container("m", env_vars=[env("A", "old")], args=["--old"])
    pod: dict[str, Any] = {"initContainers": [container("i")], "containers": [main]}
    apply_component(pod, main, fields)
    pull_secrets(pod, fields.imagePullSecrets)
    assert main["args"] == ["--v"] and env_of(main) == {"A": "new"}
    assert pod["initContainers"][0]["resources"] == {"limits": {"cpu": "1"}}
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["imagePullSecrets"] == [{"name": "s1"}, {"name": "s2"}]
    host_network(pod := {}, False)
    assert pod == {}


def test_validation_inits_run_the_validator_image() -> None:
    ds = daemonset(
        run({"validator": {"repository": "r", "image": "v", "version": "1", "imagePullPolicy": "Always"}}),
        "state-device-plugin",
    )
    init = ctr(ds, "toolkit-validation")
    assert init["image"] == "r/v:1" and init["imagePullPolicy"] == "Always"


@pytest.mark.parametrize(
    ("data", "present", "absent", "env_expect"),
    [
        ({}, ["plugin-validation"], [], {"WITH_WORKLOAD": "false"}),
        ({"devicePlugin": {"enabled": False}}, [], ["plugin-validation"], {}),
        (
            {"mig": {"strategy": "mixed"}, "validator": {"plugin": {"env": [{"name": "X", "value": "1"}]}}},
            ["plugin-validation"],
            [],
            {"MIG_STRATEGY": "mixed", "X": "1", "VALIDATOR_RUNTIME_CLASS": "nvidia"},
        ),
    ],
)
def test_operator_validator(
    data: dict[str, Any], present: list[str], absent: list[str], env_expect: dict[str, str]
) -> None:
    ds = daemonset(run(data), "state-operator-validation")
    names = [c["name"] for c in ds["spec"]["template"]["spec"]["initContainers"]]
    assert set(present) <= set(names) and not set(absent) & set(names)
    if env_expect:
        got = env_of(ctr(ds, "plugin-validation"))
        assert {k: got.get(k) for k in env_expect} == env_expect


@pytest.mark.parametrize(
    ("data", "main_env", "pod_checks"),
    [
        ({}, {"DCGM_REMOTE_HOSTENGINE_INFO": "nvidia-dcgm:5555"}, {}),
        (
            {
                "dcgm": {"enabled": False},
                "dcgmExporter": {"env": [{"name": "DCGM_REMOTE_HOSTENGINE_INFO", "value": "localhost:5555"}]},
            },
            {},
            {"hostNetwork": True},
        ),
        (
            {"dcgmExporter": {"enablePodUID": True, "hostPID": True}},
            {"DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID": "true"},
            {"automountServiceAccountToken": True, "hostPID": True},
        ),
        (
            {"dcgmExporter": {"hpcJobMapping": {"enabled": True}}},
            {"DCGM_HPC_JOB_MAPPING_DIR": "/var/lib/dcgm-exporter/job-mapping"},
            {},
        ),
        (
            {"dcgmExporter": {"config": {"name": "m"}}},
            {"DCGM_EXPORTER_COLLECTORS": "/etc/dcgm-exporter/dcgm-metrics.csv"},
            {},
        ),
    ],
)
def test_dcgm_exporter(data: dict[str, Any], main_env: dict[str, str], pod_checks: dict[str, Any]) -> None:
    result = run(data)
    ds = daemonset(result, "state-dcgm-exporter")
    got = env_of(ds["spec"]["template"]["spec"]["containers"][0])
    assert {k: got.get(k) for k in main_env} == main_env
    pod = ds["spec"]["template"]["spec"]
    assert {k: pod.get(k) for k in pod_checks} == pod_checks
    read_pods = any(
        o["metadata"]["name"] == "nvidia-dcgm-exporter-read-pods"
        for o in result.state("state-dcgm-exporter").objects
    )
    assert read_pods == bool(data.get("dcgmExporter", {}).get("enablePodUID"))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"version": "v1.17.8"}, "nvcr.io/nvidia/k8s/container-toolkit:v1.17.8"),
        ({"version": DIGEST}, f"nvcr.io/nvidia/k8s/container-toolkit@{DIGEST}"),
        (
            {"repository": "registry.example.com/mirror"},
            "registry.example.com/mirror/container-toolkit:v1.20.0",
        ),
        ({"repository": "r.example.com", "version": "v2"}, "r.example.com/container-toolkit:v2"),
    ],
)
def test_a_partial_image_replaces_that_part_of_the_default(fields: dict[str, str], expected: str) -> None:
    default = {"CONTAINER_TOOLKIT_IMAGE": "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"}
    assert (
        image_path(
            ImageFields.model_validate(fields),
            "CONTAINER_TOOLKIT_IMAGE",
            default,
            "spec.toolkit",
            partial=True,
        )
        == expected
    )
    # upstream's rule (the driver keeps it: its version is a branch for precompiled images)
    assert (
        image_path(ImageFields.model_validate(fields), "CONTAINER_TOOLKIT_IMAGE", default, "spec.toolkit")
        == default["CONTAINER_TOOLKIT_IMAGE"]
    )


def test_toolkit_version_alone_reaches_the_daemonset() -> None:
    ds = daemonset(run({"toolkit": {"version": "v1.17.8"}}), "state-container-toolkit")
    assert ctr(ds, "nvidia-container-toolkit-ctr")["image"] == "nvcr.io/nvidia/k8s/container-toolkit:v1.17.8"
