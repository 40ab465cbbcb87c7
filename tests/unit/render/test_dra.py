"""The GPUCluster renderer: NVIDIA's DRA stack as objects the apiserver accepts, each switch doing
what it says, errors naming the field and the fix, and golden files per case."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.render.clitext import format_yaml
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.dra import DRAFacts, DRANotServed, render_gpucluster
from gpu_operator.render.result import Manifest, RenderError, RenderResult
from gpu_operator.vocabulary import MANAGED_BY, STATE_LABEL
from tests.unit.render.renderkit import DRA_STATE_NAMES
from tests.unit.render.test_render import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parent / "golden_dra"
UPDATE = os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")
IMAGE = {"repository": "nvcr.io/nvidia", "image": "dra-driver-nvidia-gpu", "version": "v0.5.0"}
RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}
CASES: dict[str, dict[str, Any]] = {
    "gpus-only": {
        "draDriver": {
            **IMAGE,
            "featureGates": {"MPSSupport": True, "AdminAccess": False},
            "computeDomains": {"enabled": False},
        }
    },
    "passthrough-support": {
        "draDriver": {
            **IMAGE,
            "featureGates": {"PassthroughSupport": True},
            "computeDomains": {"enabled": False},
        }
    },
    "full-spec": {
        "draDriver": {
            **IMAGE,
            "imagePullPolicy": "Always",
            "imagePullSecrets": ["ngc"],
            "featureGates": {"MPSSupport": True},
            "gpus": {
                "kubeletPlugin": {
                    "env": [{"name": "GPUS_EXTRA", "value": "1"}],
                    "resources": RESOURCES,
                    "healthcheck": {"port": 52000},
                }
            },
            "computeDomains": {
                "enabled": True,
                "controller": {"env": [{"name": "CD_CONTROLLER_EXTRA", "value": "1"}]},
                "kubeletPlugin": {
                    "resources": {
                        "requests": {"cpu": "200m", "memory": "64Mi"},
                        "limits": {"cpu": "300m", "memory": "512Mi"},
                    },
                    "healthcheck": {"enabled": False},
                },
            },
        },
        "dcgm": {"enabled": True, "hostPort": 5555},
        "dcgmExporter": {"config": {"name": "metrics"}, "service": {"type": "NodePort"}},
        "hostPaths": {"driverInstallDir": "/opt/nvidia/driver", "kubeletRootDir": "/var/lib/k0s/kubelet"},
        "daemonsets": {
            "priorityClassName": "gpu-critical",
            "labels": {"team": "ml", "app": "not-this"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
            ],
        },
    },
}


def cluster(spec: dict[str, Any] | None) -> GPUCluster:
    body: dict[str, Any] = {"metadata": {"name": "gpu-cluster"}}
    if spec is not None:
        body["spec"] = spec
    return GPUCluster.model_validate(body)


def run(spec: dict[str, Any] | None, **facts: Any) -> RenderResult:
    return render_gpucluster(cluster(spec), DRAFacts(operator_env=dict(CHART_DEFAULT_IMAGES), **facts))


def named(result: RenderResult, kind: str, name: str) -> Manifest:
    found = [o for o in result.objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def containers(result: RenderResult, ds: str) -> dict[str, dict[str, Any]]:
    pod = named(result, "DaemonSet", ds)["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


def env_of(ctr: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ctr.get("env", [])}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_object_is_valid_for_the_apiserver_and_labelled_as_ours(case: str) -> None:
    result = run(CASES[case])
    assert (
        [s.name for s in result.states]
        == list(DRA_STATE_NAMES)
        == ["state-dra-driver", "state-dcgm", "state-dcgm-exporter", "state-dra-validation"]
    )
    assert result.objects()
    for obj in result.objects():
        if obj["kind"] != "SecurityContextConstraints":
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
        labels = obj["metadata"]["labels"]
        assert labels[MANAGED_BY] == "gpu-operator" and labels[STATE_LABEL] in DRA_STATE_NAMES, obj[
            "metadata"
        ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_golden(case: str) -> None:
    path = GOLDEN / f"{case}.yaml"
    text = format_yaml(run(CASES[case]))
    if UPDATE:
        if not path.exists() or path.read_text() != text:
            GOLDEN.mkdir(exist_ok=True)
            path.write_text(text)
            pytest.fail(
                f"rewrote {path.relative_to(ROOT)}; review the diff, then run again without UPDATE_GOLDEN"
            )
        return
    assert path.exists(), f"{path.relative_to(ROOT)} missing: run UPDATE_GOLDEN=1 .venv/bin/pytest {__file__}"
    expected = path.read_text()
    assert text == expected, "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True), text.splitlines(keepends=True), str(path), "rendered"
        )
    )


def test_the_golden_folder_holds_only_the_cases() -> None:
    assert {p.stem for p in GOLDEN.glob("*.yaml")} == set(CASES)


def test_compute_domains_bring_their_container_controller_rbac_and_classes() -> None:
    on, off = run({"draDriver": {}}), run({"draDriver": {"computeDomains": {"enabled": False}}})
    assert set(containers(on, "nvidia-dra-driver-kubelet-plugin")) == {
        "driver-validation",
        "gpus",
        "compute-domains",
    }
    assert set(containers(off, "nvidia-dra-driver-kubelet-plugin")) == {"driver-validation", "gpus"}
    cd_only = {
        ("Deployment", "nvidia-dra-driver-controller"),
        ("ClusterRole", "compute-domain-daemon"),
        ("DeviceClass", "compute-domain-daemon.nvidia.com"),
        ("DeviceClass", "compute-domain-default-channel.nvidia.com"),
        ("ServiceAccount", "compute-domain-daemon-service-account"),
    }
    keys = {(o["kind"], o["metadata"]["name"]) for o in on.objects()}
    keys_off = {(o["kind"], o["metadata"]["name"]) for o in off.objects()}
    assert cd_only <= keys and not cd_only & keys_off
    assert {
        ("DeviceClass", n) for n in ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
    } <= keys_off


def test_device_classes_select_the_driver_and_device_type() -> None:
    result = run({"draDriver": {}})
    gpu = named(result, "DeviceClass", "gpu.nvidia.com")["spec"]["selectors"][0]["cel"]["expression"]
    assert gpu == "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    channel = named(result, "DeviceClass", "compute-domain-default-channel.nvidia.com")
    assert channel["spec"]["selectors"][0]["cel"]["expression"].endswith(
        "device.attributes['compute-domain.nvidia.com'].id == 0"
    )
    assert {
        o["apiVersion"] for o in result.objects() if o["kind"] in ("DeviceClass", "ResourceClaimTemplate")
    } == {"resource.k8s.io/v1"}


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_claim_templates_follow_the_served_version(version: str) -> None:
    result = run({"draDriver": {}}, resource_api=f"resource.k8s.io/{version}")
    template = named(result, "ResourceClaimTemplate", "nvidia-dra-validator-gpu")
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert template["apiVersion"] == f"resource.k8s.io/{version}"
    wanted = {
        "deviceClassName": "gpu.nvidia.com",
        "adminAccess": True,
        "allocationMode": "ExactCount",
        "count": 1,
    }
    assert (request if version == "v1beta1" else request["exactly"]) == {
        **wanted,
        **({"name": "validation-gpu"} if version == "v1beta1" else {}),
    }
    assert request["name"] == "validation-gpu"


def test_dra_not_served_is_an_error_that_says_how_to_enable_it() -> None:
    with pytest.raises(DRANotServed) as err:
        run({"draDriver": {}}, resource_api=None)
    assert err.value.field_path == "resource.k8s.io" and "Dynamic Resource Allocation" in err.value.message


def test_a_gpucluster_without_spec_names_the_field() -> None:
    with pytest.raises(RenderError) as err:
        run(None)
    assert err.value.field_path == "spec.draDriver"


def test_image_rules_digest_env_fallback_and_partial() -> None:
    digest = run({"draDriver": {**IMAGE, "version": "sha256:" + "a" * 64}})
    gpus = containers(digest, "nvidia-dra-driver-kubelet-plugin")["gpus"]
    assert gpus["image"] == "nvcr.io/nvidia/dra-driver-nvidia-gpu@sha256:" + "a" * 64
    assert env_of(gpus)["IMAGE_NAME"] == gpus["image"]
    fallback = containers(run({"draDriver": {}}), "nvidia-dra-driver-kubelet-plugin")
    assert fallback["gpus"]["image"] == CHART_DEFAULT_IMAGES["DRA_DRIVER_IMAGE"]
    assert fallback["driver-validation"]["image"] == CHART_DEFAULT_IMAGES["VALIDATOR_IMAGE"]
    with pytest.raises(RenderError) as err:
        render_gpucluster(cluster({"draDriver": {}}), DRAFacts(operator_env={"VALIDATOR_IMAGE": "v:1"}))
    assert err.value.field_path == "spec.draDriver" and "DRA_DRIVER_IMAGE" in err.value.message
    with pytest.raises(RenderError) as err:
        render_gpucluster(cluster({"draDriver": IMAGE}), DRAFacts())
    assert err.value.field_path == "VALIDATOR_IMAGE" and "operator's Deployment" in err.value.message


def test_feature_gates_sorted_and_what_they_switch() -> None:
    result = run(
        {"draDriver": {"featureGates": {"PassthroughSupport": True, "MPSSupport": True, "DynamicMIG": False}}}
    )
    ctrs = containers(result, "nvidia-dra-driver-kubelet-plugin")
    assert env_of(ctrs["gpus"])["FEATURE_GATES"] == "DynamicMIG=false,MPSSupport=true,PassthroughSupport=true"
    assert env_of(ctrs["compute-domains"])["FEATURE_GATES"] == env_of(ctrs["gpus"])["FEATURE_GATES"]
    named(result, "Role", "nvidia-dra-driver-kubeletplugin-mps")
    paths = {m["mountPath"] for m in ctrs["gpus"]["volumeMounts"]}
    assert {"/lib/modules", "/sys", "/proc"} <= paths
    assert not {"/lib/modules", "/sys", "/proc"} & {
        m["mountPath"] for m in ctrs["compute-domains"]["volumeMounts"]
    }
    plain = run({"draDriver": {}})
    assert "FEATURE_GATES" not in env_of(containers(plain, "nvidia-dra-driver-kubelet-plugin")["gpus"])
    assert not [o for o in plain.objects() if o["metadata"]["name"].endswith("-mps")]


def test_health_checks_ports_and_switch() -> None:
    result = run(CASES["full-spec"])
    ctrs = containers(result, "nvidia-dra-driver-kubelet-plugin")
    assert ctrs["gpus"]["livenessProbe"]["grpc"] == {"port": 52000, "service": "liveness"}
    assert env_of(ctrs["gpus"])["HEALTHCHECK_PORT"] == "52000"
    assert "livenessProbe" not in ctrs["compute-domains"] and "startupProbe" not in ctrs["compute-domains"]
    assert "HEALTHCHECK_PORT" not in env_of(ctrs["compute-domains"])
    defaults = containers(run({"draDriver": {}}), "nvidia-dra-driver-kubelet-plugin")
    assert defaults["gpus"]["startupProbe"]["grpc"]["port"] == 51516
    assert defaults["compute-domains"]["livenessProbe"]["grpc"]["port"] == 51515


def test_the_init_container_may_use_what_the_plugin_containers_will() -> None:
    ctrs = containers(run(CASES["full-spec"]), "nvidia-dra-driver-kubelet-plugin")
    assert ctrs["driver-validation"]["resources"] == {
        "requests": {"cpu": "200m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "512Mi"},
    }


def test_host_paths_and_daemonset_settings() -> None:
    result = run(CASES["full-spec"])
    plugin = named(result, "DaemonSet", "nvidia-dra-driver-kubelet-plugin")
    pod = plugin["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert volumes["plugins"] == "/var/lib/k0s/kubelet/plugins"
    assert volumes["driver-install-dir"] == "/opt/nvidia/driver"
    gpus = containers(result, "nvidia-dra-driver-kubelet-plugin")["gpus"]
    assert env_of(gpus)["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/var/lib/k0s/kubelet/plugins"
    assert (
        env_of(containers(result, "nvidia-dra-driver-kubelet-plugin")["driver-validation"])[
            "DRIVER_INSTALL_DIR"
        ]
        == "/opt/nvidia/driver"
    )
    assert pod["priorityClassName"] == "gpu-critical" and pod["tolerations"][0]["key"] == "dedicated"
    labels = plugin["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "ml" and labels["app"] == "nvidia-dra-driver-kubelet-plugin"
    assert plugin["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "100%"},
    }
    assert pod["imagePullSecrets"] == [{"name": "ngc"}]
    validator = named(result, "DaemonSet", "nvidia-dra-validator")["spec"]["template"]
    assert validator["spec"]["priorityClassName"] == "system-node-critical"
    assert validator["metadata"]["labels"]["app"] == "nvidia-operator-validator"


def test_dcgm_is_off_unless_enabled_and_the_exporter_follows_its_block() -> None:
    bare = run({"draDriver": {}})
    assert [s.name for s in bare.states if s.enabled] == ["state-dra-driver", "state-dra-validation"]
    on = run({"draDriver": {}, "dcgm": {"enabled": True}, "dcgmExporter": {}})
    exporter = containers(on, "nvidia-dcgm-exporter-dra")["nvidia-dcgm-exporter-dra"]
    assert env_of(exporter)["DCGM_REMOTE_HOSTENGINE_INFO"] == "nvidia-dcgm-dra:5555"
    assert env_of(exporter)["KUBERNETES_ENABLE_DRA"] == "true"
    pod = named(on, "DaemonSet", "nvidia-dcgm-exporter-dra")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.dcgm-exporter-dra": "true"}
    assert pod["resourceClaims"] == [
        {"name": "admin-gpus", "resourceClaimTemplateName": "nvidia-dcgm-exporter-admin"}
    ]
    off = run({"draDriver": {}, "dcgm": {"enabled": True}, "dcgmExporter": {"enabled": False}})
    assert [s.name for s in off.states if s.enabled] == [
        "state-dra-driver",
        "state-dcgm",
        "state-dra-validation",
    ]


def test_the_slice_policy_binds_the_plugin_account_of_this_namespace() -> None:
    result = run({"draDriver": {}}, namespace="gpu-system")
    policy = named(result, "ValidatingAdmissionPolicy", "resourceslices-policy-nvidia-dra-driver")
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert "system:serviceaccount:gpu-system:nvidia-dra-driver-kubeletplugin" in condition
    binding = named(result, "ValidatingAdmissionPolicyBinding", "resourceslices-policy-nvidia-dra-driver")
    assert binding["spec"] == {
        "policyName": "resourceslices-policy-nvidia-dra-driver",
        "validationActions": ["Deny"],
    }


def test_openshift_gets_security_context_constraints() -> None:
    result = run({"draDriver": {}}, openshift=True)
    scc = named(result, "SecurityContextConstraints", "nvidia-dra-driver")
    assert scc["users"] == [
        "system:serviceaccount:gpu-operator:nvidia-dra-driver-kubeletplugin",
        "system:serviceaccount:gpu-operator:compute-domain-daemon-service-account",
    ]
    named(result, "SecurityContextConstraints", "nvidia-dra-validator")
    assert not [o for o in run({"draDriver": {}}).objects() if o["kind"] == "SecurityContextConstraints"]


def test_upstreams_golden_case_keeps_the_dra_contracts() -> None:
    """Our render of the GPUCluster NVIDIA's golden files render, against the contracts recorded from
    them (tools/operand_facts/contracts/gpucluster-*.yaml): only deliberate deviations."""
    from tools.operand_facts.compare import gpucluster_deviations
    from tools.operand_facts.contract import contracts, undocumented

    found = gpucluster_deviations()
    assert undocumented(found) == [], "\n".join(map(str, undocumented(found)))
    assert {k for k in contracts() if k.startswith("gpucluster/")} == {
        f"gpucluster/{s}" for s in DRA_STATE_NAMES
    }
    assert {d.id.split(":")[-1] for d in found} == {
        "coordination.k8s.io leases create",
        "coordination.k8s.io leases get",
        "coordination.k8s.io leases update",
        "coordination.k8s.io leases get nvidia-dra-driver-controller",
        "coordination.k8s.io leases update nvidia-dra-driver-controller",
        # ours: the health agent beside the DRA validator
        "container-extra",
        "ClusterRole/nvidia-dra-validator",
        "ClusterRoleBinding/nvidia-dra-validator",
        "core nodes get",
        "core nodes list",
        "core nodes patch",
        "core nodes watch",
        # the IMEX daemon's pods patch, namespaced (docs/security.md)
        "core pods patch",
        "Role/compute-domain-daemon",
        "RoleBinding/compute-domain-daemon",
    }


def test_the_dra_contract_catches_what_would_stop_the_plugin() -> None:
    import copy

    from tools.operand_facts.compare import GPUCLUSTER_FIXTURE
    from tools.operand_facts.contract import compare_state, undocumented

    state = run(GPUCLUSTER_FIXTURE).state("state-dra-driver")
    broken = copy.deepcopy(state.objects)
    plugin = next(o for o in broken if o["kind"] == "DaemonSet")
    gpus = next(c for c in plugin["spec"]["template"]["spec"]["containers"] if c["name"] == "gpus")
    gpus["env"] = [e for e in gpus["env"] if e["name"] != "KUBELET_PLUGINS_DIRECTORY_PATH"]
    gpus["volumeMounts"] = [m for m in gpus["volumeMounts"] if m["name"] != "cdi"]
    ids = {d.id for d in undocumented(compare_state("gpucluster/state-dra-driver", broken))}
    assert ids == {
        "nvidia-dra-driver-kubelet-plugin/gpus:env-missing:KUBELET_PLUGINS_DIRECTORY_PATH",
        "nvidia-dra-driver-kubelet-plugin/gpus:mount-missing:/var/run/cdi",
    }


def test_the_dra_validator_runs_the_health_agent_with_its_grant() -> None:
    result = run({"draDriver": {}})
    ds = named(result, "DaemonSet", "nvidia-dra-validator")
    pod = ds["spec"]["template"]["spec"]
    main, health = pod["containers"]
    assert health["name"] == "gpu-health" and health["command"] == ["gpu-operator", "node", "health"]
    assert health["image"] == main["image"]
    values = {e["name"]: e.get("value", e.get("valueFrom")) for e in health["env"]}
    assert values["HEALTH_VALIDATIONS"] == "none"  # no status files in this pod: its init container checked
    assert values["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert volumes == {"host-root": "/", "host-run": "/run"}
    role = named(result, "ClusterRole", "nvidia-dra-validator")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
    ]
    binding = named(result, "ClusterRoleBinding", "nvidia-dra-validator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nvidia-dra-validator", "namespace": "gpu-operator"}
    ]
