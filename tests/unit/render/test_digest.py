"""DRIVER_CONFIG_DIGEST: bit-compatible with upstream's known values, stable and sensitive."""

from __future__ import annotations

import pytest

from gpu_operator.render.transforms.digest import (
    ENV_NAME,
    DriverInstallState,
    GoEnvVar,
    VolumeConfig,
    VolumeMountConfig,
    _spew,
    digest,
    fnv32a,
    state_of_pod,
)
from tests.unit.render.renderkit import ctr, daemonset, env_of, run


def test_reproduces_upstream_driver_minimal_golden_value() -> None:
    # Inputs of upstream's NVIDIADriver "driver-minimal" golden test (internal/state): the driver
    # image, the driver-manager image and driver type gpu; everything else zero.
    state = DriverInstallState(
        DriverImage="nvcr.io/nvidia/driver:525.85.03-ubuntu22.04",
        DriverManagerImage="nvcr.io/nvidia/cloud-native/k8s-driver-manager:devel",
        DriverType="gpu",
    )
    assert digest(state) == "886542011"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("x", "(string)x"),
        (True, "(bool)true"),
        (["init", "--a"], "([]string)[init --a]"),
        (
            [GoEnvVar("A", "1"), GoEnvVar("B", "")],
            "([]config.EnvVar)[{Name:(string)A Value:(string)1} {Name:(string)B Value:(string)}]",
        ),
    ],
)
def test_spew_rendering(value: object, expected: str) -> None:
    assert _spew(value) == expected


def test_go_type_names_of_structs() -> None:
    # upstream's types are config.EnvVar, config.VolumeConfig, config.VolumeMountConfig
    assert _spew([VolumeConfig("v", HostPath="/x")]) == (
        "([]config.VolumeConfig)[{Name:(string)v ConfigMapName:(string) SecretName:(string) HostPath:(string)/x}]"
    )
    assert _spew([VolumeMountConfig("v", "/m", ReadOnly=True)]) == (
        "([]config.VolumeMountConfig)[{Name:(string)v MountPath:(string)/m SubPath:(string) ReadOnly:(bool)true}]"
    )


def test_fnv32a_known_vectors() -> None:
    assert fnv32a(b"") == 0x811C9DC5
    assert fnv32a(b"a") == 0xE40C292C


def test_zero_fields_do_not_count_and_order_does_not_matter() -> None:
    base = DriverInstallState(DriverImage="i")
    assert digest(base) == digest(DriverInstallState(DriverImage="i", DriverArgs=[], GDSEnabled=False))
    assert digest(base) != digest(DriverInstallState(DriverImage="i", GDSEnabled=True))


def test_rendered_driver_carries_the_digest_of_its_own_pod() -> None:
    ds = daemonset(run(), "state-driver")
    pod = ds["spec"]["template"]["spec"]
    value = env_of(ctr(ds, "nvidia-driver-ctr"))[ENV_NAME]
    assert env_of(ctr(ds, "k8s-driver-manager"))[ENV_NAME] == value
    for c in [*pod["initContainers"], *pod["containers"]]:  # recompute without the stamp itself
        c["env"] = [e for e in c.get("env", []) if e["name"] != ENV_NAME]
    assert digest(state_of_pod(pod)) == value


def test_digest_follows_driver_settings_but_not_unrelated_ones() -> None:
    def value(spec: dict[str, object]) -> str:
        return env_of(ctr(daemonset(run(spec), "state-driver"), "nvidia-driver-ctr"))[ENV_NAME]

    base = value({})
    assert value({"devicePlugin": {"enabled": False}}) == base
    assert value({"driver": {"repository": "r.example", "image": "driver", "version": "999.1"}}) != base
    assert value({"driver": {"kernelModuleType": "open"}}) != base
    assert value({"driver": {"env": [{"name": "X", "value": "1"}]}}) != base
