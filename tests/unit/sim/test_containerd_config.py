"""The private containerd's configuration keeps everything under its own directory."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpu_operator.sim.realnode import containerd as ctrd_mod
from gpu_operator.sim.realnode.containerd import ContainerdError, Mount, PrivateContainerd


def test_config_keeps_root_state_and_sockets_under_base_dir(tmp_path: Path) -> None:
    ctrd = PrivateContainerd(tmp_path / "c", snapshotter="native")
    config = tomllib.loads(ctrd.config_toml())
    base = str(tmp_path / "c")
    assert config["root"] == f"{base}/root"
    assert config["state"] == f"{base}/state"
    assert config["grpc"]["address"] == f"{base}/containerd.sock"
    assert config["ttrpc"]["address"] == f"{base}/ttrpc.sock"
    assert "/run/containerd" not in ctrd.config_toml() and "/var/lib/containerd" not in ctrd.config_toml()
    assert config["disabled_plugins"] == ["io.containerd.grpc.v1.cri"]
    assert ctrd.endpoint == f"unix://{base}/containerd.sock"


def test_cri_mode_keeps_the_cri_plugin_and_appends_extra_config(tmp_path: Path) -> None:
    extra = '[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "registry.k8s.io/pause:3.10"\n'
    config = tomllib.loads(PrivateContainerd(tmp_path, cri=True, extra_config=extra).config_toml())
    assert config["disabled_plugins"] == []
    assert config["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"] == "registry.k8s.io/pause:3.10"


def test_mount_arguments() -> None:
    assert Mount("/srv/h", "/host").ctr_arg() == "type=bind,src=/srv/h,dst=/host,options=rbind:ro"
    assert Mount("/srv/h", "/host", readonly=False).ctr_arg().endswith("options=rbind:rw")


def test_start_names_the_missing_binaries_and_the_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ctrd_mod, "missing_binaries", lambda: ["runc"])
    with pytest.raises(ContainerdError, match=r"runc not found on PATH.*containerd runc"):
        PrivateContainerd(tmp_path).start()


def test_a_directory_too_long_for_its_sockets_is_refused_naming_the_fix(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * (ctrd_mod.MAX_SOCKET_PATH - len(str(tmp_path))))
    with pytest.raises(ContainerdError, match=r"104 at most: use a shorter directory"):
        PrivateContainerd(deep).start()
