"""Invalid ClusterPolicies and NVIDIADrivers, and where each must be stopped (test_bad_input.py).

`rejected`: the apiserver refuses the object (CRD schema or CEL) with a message naming `field`.
`reported`: the apiserver stores it; the operator reports the field and the fix in status and
applies nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REJECTED, REPORTED = "rejected-by-apiserver", "reported-in-status"
CP, NVD = "ClusterPolicy", "NVIDIADriver"
HUGE = "x" * 100_000  # far beyond any limit, well under the apiserver's request size limit


@dataclass(frozen=True)
class Case:
    case: str  # what is wrong, in words (the table's first column)
    kind: str
    spec: dict[str, Any]
    where: str  # the field the message must name
    outcome: str
    name: str = ""  # metadata.name; default: derived from the case's position


def _cp(case: str, spec: dict[str, Any], where: str, outcome: str, name: str = "") -> Case:
    return Case(case, CP, spec, where, outcome, name)


def _nvd(case: str, spec: dict[str, Any], where: str, outcome: str, name: str = "") -> Case:
    return Case(case, NVD, spec, where, outcome, name)


CASES: list[Case] = [
    # -- wrong types ------------------------------------------------------------------------------
    _cp("boolean as a string", {"driver": {"enabled": "yes"}}, "spec.driver.enabled", REJECTED),
    _cp(
        "list as a string",
        {"devicePlugin": {"args": "--fail-on-init-error"}},
        "spec.devicePlugin.args",
        REJECTED,
    ),
    _cp("list as a map", {"driver": {"env": {"A": "b"}}}, "spec.driver.env", REJECTED),
    _cp("integer as a string", {"dcgm": {"hostPort": "5555"}}, "spec.dcgm.hostPort", REJECTED),
    _cp("map as a list", {"daemonsets": {"labels": ["team=gpu"]}}, "spec.daemonsets.labels", REJECTED),
    _cp(
        "tolerations as a string",
        {"daemonsets": {"tolerations": "all"}},
        "spec.daemonsets.tolerations",
        REJECTED,
    ),
    _cp("object as a number", {"validator": {"plugin": 3}}, "spec.validator.plugin", REJECTED),
    _cp(
        "env entry without a name",
        {"toolkit": {"env": [{"value": "1"}]}},
        "spec.toolkit.env[0].name",
        REJECTED,
    ),
    # -- enums ------------------------------------------------------------------------------------
    _cp(
        "unknown default workload",
        {"sandboxWorkloads": {"defaultWorkload": "vm-everything"}},
        "spec.sandboxWorkloads.defaultWorkload",
        REJECTED,
    ),
    _cp(
        "unknown sandbox mode",
        {"sandboxWorkloads": {"mode": "firecracker"}},
        "spec.sandboxWorkloads.mode",
        REJECTED,
    ),
    _cp("unknown MIG strategy", {"mig": {"strategy": "double"}}, "spec.mig.strategy", REJECTED),
    _cp(
        "unknown kernel module type",
        {"driver": {"kernelModuleType": "closed"}},
        "spec.driver.kernelModuleType",
        REJECTED,
    ),
    _cp(
        "precompiled as a kernel module type",
        {"driver": {"kernelModuleType": "precompiled"}},
        "usePrecompiled: true",
        REJECTED,
    ),
    _cp(
        "runcompiled as a kernel module type",
        {"driver": {"kernelModuleType": "runcompiled"}},
        "usePrecompiled: false",
        REJECTED,
    ),
    _cp(
        "unknown update strategy",
        {"daemonsets": {"updateStrategy": "Recreate"}},
        "spec.daemonsets.updateStrategy",
        REJECTED,
    ),
    _cp(
        "unknown image pull policy",
        {"driver": {"imagePullPolicy": "Sometimes"}},
        "spec.driver.imagePullPolicy",
        REJECTED,
    ),
    _cp("unknown CC mode", {"ccManager": {"defaultMode": "maybe"}}, "spec.ccManager.defaultMode", REJECTED),
    _cp(
        "unknown service type",
        {"dcgmExporter": {"service": {"type": "ExternalName"}}},
        "spec.dcgmExporter.service.type",
        REJECTED,
    ),
    _cp(
        "unknown MIG default config",
        {"migManager": {"config": {"default": "all-enabled"}}},
        "spec.migManager.config.default",
        REJECTED,
    ),
    _cp("unknown runtime", {"operator": {"defaultRuntime": "rkt"}}, "spec.operator.defaultRuntime", REJECTED),
    # -- numbers out of range ---------------------------------------------------------------------
    _cp("port above 65535", {"dcgm": {"hostPort": 70000}}, "spec.dcgm.hostPort", REJECTED),
    _cp("negative port", {"dcgm": {"hostPort": -1}}, "spec.dcgm.hostPort", REJECTED),
    _cp(
        "negative parallel upgrades",
        {"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}},
        "spec.driver.upgradePolicy.maxParallelUpgrades",
        REJECTED,
    ),
    _cp(
        "negative drain timeout",
        {"driver": {"upgradePolicy": {"drain": {"timeoutSeconds": -5}}}},
        "spec.driver.upgradePolicy.drain.timeoutSeconds",
        REJECTED,
    ),
    _cp(
        "negative probe threshold",
        {"driver": {"livenessProbe": {"failureThreshold": -3}}},
        "spec.driver.livenessProbe.failureThreshold",
        REJECTED,
    ),
    _cp(
        "negative pod deletion timeout",
        {"driver": {"upgradePolicy": {"podDeletion": {"timeoutSeconds": -1}}}},
        "spec.driver.upgradePolicy.podDeletion.timeoutSeconds",
        REJECTED,
    ),
    _cp(
        "maxUnavailable above 100%",
        {"driver": {"upgradePolicy": {"maxUnavailable": "150%"}}},
        "spec.driver.upgradePolicy.maxUnavailable",
        REPORTED,
    ),
    _cp(
        "maxUnavailable not a number",
        {"daemonsets": {"rollingUpdate": {"maxUnavailable": "some"}}},
        "spec.daemonsets.rollingUpdate.maxUnavailable",
        REPORTED,
    ),
    # -- conflicting settings ---------------------------------------------------------------------
    _cp(
        "NRI plugin with CDI off",
        {"cdi": {"enabled": False, "nriPluginEnabled": True}},
        "nriPluginEnabled",
        REJECTED,
    ),
    _cp(
        "NRI plugin with the toolkit off",
        {"cdi": {"nriPluginEnabled": True}, "toolkit": {"enabled": False}},
        "nriPluginEnabled",
        REJECTED,
    ),
    _cp(
        "precompiled driver with GDS",
        {"driver": {"usePrecompiled": True}, "gds": {"enabled": True}},
        "driver.usePrecompiled",
        REJECTED,
    ),
    _cp(
        "precompiled driver with GDRCopy",
        {"driver": {"usePrecompiled": True}, "gdrcopy": {"enabled": True}},
        "driver.usePrecompiled",
        REJECTED,
    ),
    # -- image references -------------------------------------------------------------------------
    _cp(
        "uppercase repository",
        {"driver": {"repository": "nvcr.io/NVIDIA"}},
        "spec.driver.repository",
        REPORTED,
    ),
    _cp(
        "repository with a scheme",
        {"dcgmExporter": {"repository": "https://nvcr.io/nvidia"}},
        "spec.dcgmExporter.repository",
        REPORTED,
    ),
    _cp(
        "image name with a space",
        {"devicePlugin": {"image": "device plugin"}},
        "spec.devicePlugin.image",
        REPORTED,
    ),
    _cp("tag with a colon", {"toolkit": {"version": "v1.17:latest"}}, "spec.toolkit.version", REPORTED),
    _cp("digest too short", {"gfd": {"version": "sha256:abc"}}, "spec.gfd.version", REPORTED),
    _cp("huge image version", {"driver": {"version": HUGE}}, "spec.driver.version", REJECTED),
    _cp("huge repository", {"validator": {"repository": HUGE}}, "spec.validator.repository", REJECTED),
    # -- names and label values -------------------------------------------------------------------
    _cp("invalid ClusterPolicy name", {}, "metadata.name", REJECTED, name="Cluster_Policy"),
    _cp(
        "ConfigMap name with capitals",
        {"driver": {"repoConfig": {"configMapName": "Custom_Repo"}}},
        "spec.driver.repoConfig.configMapName",
        REPORTED,
    ),
    _cp(
        "device plugin config name with a space",
        {"devicePlugin": {"config": {"name": "time slicing"}}},
        "spec.devicePlugin.config.name",
        REPORTED,
    ),
    _cp(
        "runtime class name with a space",
        {"operator": {"runtimeClass": "nvidia runtime"}},
        "spec.operator.runtimeClass",
        REPORTED,
    ),
    _cp(
        "priority class name with capitals",
        {"daemonsets": {"priorityClassName": "High"}},
        "spec.daemonsets.priorityClassName",
        REPORTED,
    ),
    _cp("huge Secret name", {"driver": {"secretEnv": HUGE}}, "spec.driver.secretEnv", REPORTED),
    _cp(
        "pull secret name with a slash",
        {"driver": {"imagePullSecrets": ["ns/secret"]}},
        "spec.driver.imagePullSecrets.0",
        REPORTED,
    ),
    _cp(
        "label value with a space",
        {"daemonsets": {"labels": {"team": "gpu team"}}},
        "spec.daemonsets.labels.team",
        REJECTED,
    ),
    _cp(
        "label value over 63 characters",
        {"daemonsets": {"labels": {"team": "g" * 64}}},
        "spec.daemonsets.labels.team",
        REJECTED,
    ),
    _cp(
        "huge label value",
        {"dcgmExporter": {"serviceMonitor": {"additionalLabels": {"a": HUGE}}}},
        "spec.dcgmExporter.serviceMonitor.additionalLabels.a",
        REJECTED,
    ),
    _cp(
        "label key with a space",
        {"daemonsets": {"labels": {"my team": "gpu"}}},
        "spec.daemonsets.labels",
        REPORTED,
    ),
    _cp(
        "label key with an empty name",
        {"daemonsets": {"labels": {"example.com/": "x"}}},
        "spec.daemonsets.labels",
        REPORTED,
    ),
    _cp(
        "annotation key with a bad prefix",
        {"daemonsets": {"annotations": {"-bad.example/key": "x"}}},
        "spec.daemonsets.annotations",
        REPORTED,
    ),
    # -- other values a pod spec refuses ----------------------------------------------------------
    _cp(
        "env name with '='",
        {"driver": {"env": [{"name": "A=B", "value": "1"}]}},
        "spec.driver.env.0.name",
        REPORTED,
    ),
    _cp(
        "memory limit not a quantity",
        {"driver": {"resources": {"limits": {"memory": "lots"}}}},
        "spec.driver.resources.limits.memory",
        REPORTED,
    ),
    _cp("relative root path", {"hostPaths": {"rootFS": "host"}}, "spec.hostPaths.rootFS", REPORTED),
    _cp(
        "relative toolkit install dir",
        {"toolkit": {"installDir": "usr/local/nvidia"}},
        "spec.toolkit.installDir",
        REPORTED,
    ),
    # -- Kubernetes and monitoring types typed as upstream's CRD has them -------------------------
    _cp(
        "scrape interval not a duration",
        {"dcgmExporter": {"serviceMonitor": {"interval": "often"}}},
        "spec.dcgmExporter.serviceMonitor.interval",
        REJECTED,
    ),
    _cp(
        "unknown relabeling action",
        {"dcgmExporter": {"serviceMonitor": {"relabelings": [{"action": "rename"}]}}},
        "spec.dcgmExporter.serviceMonitor.relabelings[0].action",
        REJECTED,
    ),
    _cp(
        "toleration seconds as a string",
        {"daemonsets": {"tolerations": [{"operator": "Exists", "tolerationSeconds": "300"}]}},
        "spec.daemonsets.tolerations[0].tolerationSeconds",
        REJECTED,
    ),
    _cp(
        "run-as user as a name",
        {"daemonsets": {"podSecurityContext": {"runAsUser": "nobody"}}},
        "spec.daemonsets.podSecurityContext.runAsUser",
        REJECTED,
    ),
    # -- NVIDIADriver -----------------------------------------------------------------------------
    _nvd("unknown driver type", {"driverType": "cuda"}, "spec.driverType", REJECTED),
    _nvd("image as a number", {"image": 535}, "spec.image", REJECTED),
    _nvd("unknown kernel module type", {"kernelModuleType": "closed"}, "spec.kernelModuleType", REJECTED),
    _nvd(
        "precompiled as a kernel module type",
        {"kernelModuleType": "precompiled"},
        "usePrecompiled: true",
        REJECTED,
    ),
    _nvd(
        "runcompiled as a kernel module type",
        {"kernelModuleType": "runcompiled"},
        "usePrecompiled: false",
        REJECTED,
    ),
    # -- spec.health (ours) -----------------------------------------------------------------------
    _cp(
        "unknown remediation action",
        {"health": {"remediation": {"actions": ["reboot", "format-disk"]}}},
        "spec.health.remediation.actions[1]",
        REJECTED,
    ),
    _cp(
        "remediation maxUnavailable neither a number nor a percentage",
        {"health": {"remediation": {"maxUnavailable": "two"}}},
        "spec.health.remediation.maxUnavailable",
        REJECTED,
    ),
    _cp(
        "external remediation without the handoff label",
        {"health": {"remediation": {"actions": ["external"]}}},
        "spec.health.remediation",
        REPORTED,
    ),
    _cp(
        "startup taint the operator may not remove",
        {"health": {"startupTaint": {"key": "example.com/booting"}}},
        "spec.health.startupTaint.key",
        REPORTED,
    ),
    _nvd(
        "default driver with a nodeSelector",
        {"default": True, "nodeSelector": {"pool": "a"}},
        "spec.nodeSelector",
        REJECTED,
    ),
    _nvd(
        "nodeSelector on the owner label",
        {"nodeSelector": {"nvidia.com/gpu-operator.driver.owner": "x"}},
        "spec.nodeSelector",
        REJECTED,
    ),
    _nvd(
        "negative parallel upgrades",
        {"upgradePolicy": {"maxParallelUpgrades": -2}},
        "spec.upgradePolicy.maxParallelUpgrades",
        REJECTED,
    ),
    _nvd(
        "nodeSelector value with a space",
        {"nodeSelector": {"pool": "pool a"}},
        "spec.nodeSelector.pool",
        REJECTED,
    ),
    _nvd(
        "nodeSelector key with a space", {"nodeSelector": {"node pool": "a"}}, "spec.nodeSelector", REPORTED
    ),
    _nvd("uppercase repository", {"repository": "Registry.example.com/Nvidia"}, "spec.repository", REPORTED),
    _nvd("image with two tags", {"image": "nvcr.io/nvidia/driver:1:2"}, "spec.image", REPORTED),
    _nvd(
        "priority class name with a space",
        {"priorityClassName": "high priority"},
        "spec.priorityClassName",
        REPORTED,
    ),
    _nvd("invalid NVIDIADriver name", {}, "metadata.name", REJECTED, name="Pool_A"),
]
