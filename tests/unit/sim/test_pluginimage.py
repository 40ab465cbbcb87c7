"""The device plugin's image on the real node: our image plus one layer with the stand-in's gRPC
libraries and the executable the operator's DaemonSet runs, under NVIDIA's image name, as root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.sim.realnode import pluginimage
from gpu_operator.sim.standins import deviceplugin
from gpu_operator.sim.standins.deviceplugin import env_strategy
from tests.unit.sim.test_cudasample import _base


def test_the_image_has_nvidias_name_the_stand_ins_libraries_and_runs_as_root(tmp_path: Path) -> None:
    out = pluginimage.build(_base(tmp_path / "base.tar"), tmp_path / "plugin.tar")
    with tarfile.open(out) as tar:
        (entry,) = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert entry["RepoTags"] == [CHART_DEFAULT_IMAGES["DEVICE_PLUGIN_IMAGE"]]
        config = json.load(tar.extractfile(entry["Config"]))  # type: ignore[arg-type]
        assert config["config"]["User"] == "0:0"
        assert config["config"]["Entrypoint"] == ["gpu-operator"]  # the rest of our image's config kept
        assert len(config["rootfs"]["diff_ids"]) == len(entry["Layers"]) == 2
        with tarfile.open(fileobj=tar.extractfile(entry["Layers"][-1])) as added:
            names = set(added.getnames())
    assert pluginimage.EXECUTABLE.lstrip("/") in names
    site = pluginimage.SITE.lstrip("/")
    assert {f"{site}/grpc/__init__.py", f"{site}/google/protobuf/__init__.py"} <= names
    assert any(n.startswith(f"{site}/grpc/_cython/cygrpc") for n in names)
    assert f"{pluginimage.LIBDIR.lstrip('/')}/libstdc++.so.6" in names  # gRPC links the C++ runtime
    # every file's directories are in the layer (an importer's parents exist)
    assert {f"{site}/grpc", f"{site}/grpc/_cython", "usr/local/bin"} <= names


def test_the_executable_starts_the_stand_in_over_the_pods_mounts(tmp_path: Path) -> None:
    """The entry script, run with `python3.11` being a recorder: the stand-in's module over /host,
    the kubelet's socket directory and the pod's /var/run/cdi, the DaemonSet's arguments appended."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.json"
    fake = bin_dir / "python3.11"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
    )
    fake.chmod(0o755)
    script = tmp_path / "nvidia-device-plugin"
    script.write_text(pluginimage.ENTRY)
    script.chmod(0o755)
    subprocess.run(
        [str(script), "--mig-strategy=mixed"],
        check=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert json.loads(record.read_text()) == [
        "-m",
        "gpu_operator.sim.standins.deviceplugin",
        "--host-root=/host",
        "--plugin-dir=/var/lib/kubelet/device-plugins",
        "--cdi-root=/",
        "--mig-strategy=mixed",
    ]


@pytest.mark.parametrize(
    ("value", "played"),
    [
        ("", "envvar"),
        ("envvar", "envvar"),
        ("cdi-annotations,cdi-cri", "cdi-annotations"),
        ("cdi-cri,envvar", "envvar"),
    ],
)
def test_device_list_strategy_from_the_environment(value: str, played: str) -> None:
    assert env_strategy(value) == played


def test_a_device_list_strategy_the_stand_in_does_not_play_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="DEVICE_LIST_STRATEGY='cdi-cri'"):
        env_strategy("cdi-cri")


def test_the_cdi_spec_goes_to_the_cdi_root_not_the_read_only_host_tree(tmp_path: Path) -> None:
    from gpu_operator.sim.hardware import hosttree
    from gpu_operator.sim.realnode.realspec import host_spec

    tree = tmp_path / "tree"
    hosttree.build(host_spec("host-driver"), tree)
    deviceplugin.GpuPlugin(tree, "cdi-annotations", cdi_root=tmp_path / "pod").write_cdi_spec()
    spec = json.loads((tmp_path / "pod" / deviceplugin.CDI_SPEC.lstrip("/")).read_text())
    assert spec["kind"] == deviceplugin.CDI_KIND and len(spec["devices"]) == 2
    assert not (tree / deviceplugin.CDI_SPEC.lstrip("/")).exists()


def test_the_standalone_plugin_pod_sees_its_tree_and_the_mig_state_beside_it(tmp_path: Path) -> None:
    from gpu_operator.sim.hardware import migtree
    from tests.support import realplugin

    tree = tmp_path / "h100" / "root"
    tree.mkdir(parents=True)

    def mounts(manifest: dict[str, object]) -> dict[str, str]:
        spec = manifest["spec"]
        volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}  # type: ignore[index]
        ctr = spec["containers"][0]  # type: ignore[index]
        return {m["mountPath"]: volumes[m["name"]] for m in ctr["volumeMounts"]}

    plain = realplugin.pod_manifest("real-node-0", tree)
    assert plain["spec"]["containers"][0]["args"] == [f"--host-root={realplugin.HOSTS}/root"]
    assert mounts(plain)[f"{realplugin.HOSTS}/root"] == str(tree)
    assert f"{realplugin.HOSTS}/{migtree.STATE_FILE}" not in mounts(plain)
    (tree.parent / migtree.STATE_FILE).write_text("[]")
    mig = realplugin.pod_manifest("real-node-0", tree, "mixed")
    assert mounts(mig)[f"{realplugin.HOSTS}/{migtree.STATE_FILE}"] == str(tree.parent / migtree.STATE_FILE)
    assert {"name": "MIG_STRATEGY", "value": "mixed"} in mig["spec"]["containers"][0]["env"]
