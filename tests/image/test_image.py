"""The image `./dev image` builds: reproducible, small, described by its SBOM, and working in a
real container (a private containerd + runc from Debian's packages, started here as root).

Slow (a build, a second build, containerd); part of `./dev test`. When the image cannot be built
or a container cannot run here, these tests fail and say why: they never skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpu_operator.render.defaults import OWN_IMAGE
from gpu_operator.sim.realnode.containerd import Mount, PrivateContainerd
from tests.image.imagebuild import REPO, TIMEOUT, Built, build, oci_blob, oci_blob_index, sha256
from tests.support.hostsim import fakehost

pytestmark = [pytest.mark.image, TIMEOUT]

HOSTS = REPO / "tests" / "fixtures" / "hosts"
SIZE_LIMIT = 150_000_000
IMAGE_USER = "65532:65532"


def test_a_second_build_from_the_same_commit_gives_the_same_digest(built: Built, tmp_path: Path) -> None:
    again = build(tmp_path)
    assert again.digest == built.digest
    assert sha256(again.oci_archive) == sha256(built.oci_archive), "the OCI archives differ byte-wise"
    for suffix in (".docker.tar", ".sbom.cdx.json"):
        assert sha256(again.sibling(suffix)) == sha256(built.sibling(suffix)), f"the {suffix} files differ"


def test_name_tag_and_digest_are_the_charts(built: Built) -> None:
    chart = yaml.safe_load((REPO / "deployments/gpu-operator/Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "deployments/gpu-operator/values.yaml").read_text())
    op = values["operator"]
    assert built.ref == f"{op['repository']}/{op['image']}:{chart['appVersion']}"
    assert built.ref == OWN_IMAGE  # what the renderer puts in operand pods by default
    assert values["validator"]["repository"] == op["repository"]
    assert values["validator"]["image"] == op["image"]
    assert built.sibling(".digest").read_text().strip() == built.digest
    index = json.loads(oci_blob_index(built.oci_archive))
    assert [m["digest"] for m in index["manifests"]] == [built.digest]


def test_config_runs_as_non_root_and_layer_is_clean(built: Built) -> None:
    manifest = json.loads(oci_blob(built.oci_archive, built.digest))
    config = json.loads(oci_blob(built.oci_archive, manifest["config"]["digest"]))
    assert config["config"]["User"] == IMAGE_USER
    assert "PYTHONDONTWRITEBYTECODE=1" in config["config"]["Env"]
    assert (
        config["config"]["Labels"]["org.opencontainers.image.revision"]
        == subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, check=True
        ).stdout.strip()
    )
    assert config["config"]["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"
    (layer,) = manifest["layers"]
    import gzip
    import io

    with tarfile.open(
        fileobj=io.BytesIO(gzip.decompress(oci_blob(built.oci_archive, layer["digest"])))
    ) as tar:
        members = tar.getmembers()
    names = [m.name.removeprefix("./") for m in members]
    assert names == sorted(names, key=lambda n: n.split("/")), "layer entries are not sorted"
    assert "usr/local/bin/gpu-operator" in names and "usr/local/bin/nvidia-validator" in names
    assert not [n for n in names if n.startswith("usr/local/") and (n.endswith(".pyc") or "__pycache__" in n)]
    assert not [n for n in names if "/.cache/pip" in n or n.startswith("tmp/install")]
    assert sum(m.size for m in members) < SIZE_LIMIT
    assert built.size < SIZE_LIMIT, f"image is {built.size / 1e6:.0f} MB uncompressed (target < 150 MB)"


def test_sbom_lists_debian_and_python_packages(built: Built) -> None:
    sbom = json.loads(built.sibling(".sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    assert sbom["metadata"]["component"]["version"] == built.ref.rsplit(":", 1)[1]
    purls = {c["purl"].split("?")[0] for c in sbom["components"]}
    assert any(p.startswith("pkg:deb/debian/python3.11-minimal@3.11") for p in purls)
    assert any(p.startswith("pkg:deb/debian/ca-certificates@") for p in purls)
    assert "pkg:pypi/kopf@1.45.2" in purls and "pkg:pypi/gpu-operator@0.1.0" in purls
    locked = [
        line.split()[0].split("==")
        for line in (REPO / "tools/image/requirements.lock").read_text().splitlines()
        if "==" in line
    ]
    for name, version in locked:
        assert f"pkg:pypi/{name.lower().replace('_', '-')}@{version}" in purls, name


# --- in a real container ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def containerd(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateContainerd]:
    if os.geteuid() != 0:
        pytest.fail("running the image needs root (containerd, runc): run the tests as root")
    ctrd = PrivateContainerd(tmp_path_factory.mktemp("containerd"))
    ctrd.start()
    try:
        refs = ctrd.import_image(built.sibling(".docker.tar"))
        assert built.ref in refs, refs
        yield ctrd
    finally:
        ctrd.stop()


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    fakehost.build_file(HOSTS / "h100-nvidia-bound.yaml", root)
    validations = root / "run" / "nvidia" / "validations"
    validations.mkdir(parents=True, exist_ok=True)
    os.chown(validations, 65532, 65532)  # the image's user writes the status files
    return root


def test_oci_archive_imports_with_the_built_digest(containerd: PrivateContainerd, built: Built) -> None:
    repo = built.ref.rsplit(":", 1)[0]
    other = PrivateContainerd(containerd.base_dir, namespace="oci-import")
    # the same daemon, another namespace
    assert other.import_image(built.oci_archive, base_name=repo) == [built.ref]
    assert other.image_digest(built.ref) == built.digest
    # the docker-archive carries a Docker manifest of the same config and layer: another digest
    assert containerd.image_digest(built.ref).startswith("sha256:")


def test_help_runs_in_a_container(containerd: PrivateContainerd, built: Built) -> None:
    result = containerd.run(built.ref, ["gpu-operator", "--help"])
    assert result.ok, result.describe()
    assert "Usage: gpu-operator" in result.stdout and "node" in result.stdout
    who = containerd.run(built.ref, ["id", "-u"])
    assert who.stdout.strip() == "65532", who.describe()
    # the sandbox-validation pod's command, with the validator image
    shell = containerd.run(built.ref, ["sh", "-c", "echo all validations are successful; sleep 0"])
    assert shell.ok and shell.stdout.strip() == "all validations are successful", shell.describe()


def test_node_probe_reads_the_mounted_host(
    containerd: PrivateContainerd, built: Built, host_root: Path
) -> None:
    result = containerd.run(
        built.ref,
        ["gpu-operator", "node", "probe", "--host-root", "/host"],
        mounts=[Mount(host_root, "/host")],
    )
    assert result.ok, result.describe()
    facts = json.loads(result.stdout)
    assert facts["host_root"] == "/host"
    assert facts["kernel"] == "6.8.0-48-generic"
    gpus = [f for f in facts["nvidia_functions"] if f["device"] == "2330"]
    assert len(gpus) == 8 and {g["driver"] for g in gpus} == {"nvidia"}


def test_validator_entry_validates_the_driver(
    containerd: PrivateContainerd, built: Built, host_root: Path
) -> None:
    # No chroot as a non-root user: nvidia-smi is run from under /host directly. The host's
    # /dev/char is mounted read-write at /host-dev-char, as the rendered pod mounts it.
    env = {"COMPONENT": "driver", "NODE_NAME": "gpu-node-1", "GPU_OPERATOR_NO_CHROOT": "1"}
    dev_char = host_root.parent / "dev-char"
    dev_char.mkdir()
    os.chown(dev_char, 65532, 65532)
    result = containerd.run(
        built.ref,
        ["nvidia-validator"],
        env=env,
        mounts=[Mount(host_root, "/host", readonly=False), Mount(dev_char, "/host-dev-char", readonly=False)],
    )
    assert result.ok, result.describe()
    assert "driver: passed" in result.stdout and "550.127.05" in result.stdout
    assert (host_root / "run/nvidia/validations/driver-ready").is_file()
    # the links of the tree's device nodes (the fixture's loaded driver made them) went to the mount
    assert os.readlink(dev_char / "195:255") == "../nvidiactl", sorted(p.name for p in dev_char.iterdir())
    failing = containerd.run(
        built.ref,
        ["nvidia-validator"],
        env={**env, "COMPONENT": "driver"},
        mounts=[Mount(REPO / "tests" / "fixtures", "/host")],
    )
    assert not failing.ok, failing.describe()
