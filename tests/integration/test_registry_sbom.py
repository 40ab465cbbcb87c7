"""tools/chart/push.sh (the push step of `./dev release`) attaches our image's SBOM as an OCI 1.1
referrer: after a push to the simulator's registry, its referrers API lists one CycloneDX artifact
for the image's manifest digest, and that artifact's layer is `./dev image`'s SBOM file byte for byte."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

from gpu_operator import __version__
from gpu_operator.sim.realnode import image_archive
from gpu_operator.sim.registry import Registry

REPO = Path(__file__).resolve().parents[2]
SBOM = "application/vnd.cyclonedx+json"


def _get(registry: Registry, path: str, accept: str = "*/*") -> bytes:
    req = urllib.request.Request(f"https://{registry.host}{path}", headers={"Accept": accept})
    auth = base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {auth}")
    context = ssl.create_default_context(cafile=str(registry.ca_cert))
    with urllib.request.urlopen(req, context=context, timeout=30) as answer:
        body: bytes = answer.read()
    return body


def test_the_release_push_attaches_the_sbom_as_a_referrer_of_the_image(
    registry: Registry, tmp_path: Path
) -> None:
    # the OCI archive is built with the docker-archive image_archive() makes current
    archive = image_archive().with_name(f"gpu-operator-{__version__}.oci.tar")
    sbom_file = archive.with_name(f"gpu-operator-{__version__}.sbom.cdx.json")
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        assert index is not None
        image_digest = json.load(index)["manifests"][0]["digest"]
    charts = tmp_path / "charts"
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "chart" / "release.py"), "--out", str(charts)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    creds = tmp_path / "creds"
    creds.write_text(f"{registry.user}:{registry.password}")
    env = {
        **os.environ,
        **{f"HELM_{k}_HOME": str(tmp_path / "helm" / k.lower()) for k in ("CONFIG", "CACHE", "DATA")},
    }
    pushed = subprocess.run(
        [
            str(REPO / "tools" / "chart" / "push.sh"),
            f"{registry.host}/sbom",
            "--ca-file",
            str(registry.ca_cert),
            "--creds-file",
            str(creds),
            "--charts",
            str(charts),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert pushed.returncode == 0, pushed.stderr

    name = "sbom/gpu-operator-py/gpu-operator"
    referrers = json.loads(
        _get(registry, f"/v2/{name}/referrers/{image_digest}", "application/vnd.oci.image.index.v1+json")
    )
    # one referrer. (go-containerregistry's registry lists a referrer's config.mediaType as its
    # artifactType, not the manifest's artifactType field: the manifest below is read for that.)
    (listed,) = referrers["manifests"]
    artifact_digest = listed["digest"]
    assert f"push: SBOM {artifact_digest} attached to {image_digest}" in pushed.stderr.splitlines()
    manifest: dict[str, Any] = json.loads(
        _get(
            registry, f"/v2/{name}/manifests/{artifact_digest}", "application/vnd.oci.image.manifest.v1+json"
        )
    )
    assert manifest["subject"]["digest"] == image_digest
    assert manifest["artifactType"] == SBOM
    (layer,) = manifest["layers"]
    assert layer["annotations"]["org.opencontainers.image.title"] == sbom_file.name
    assert _get(registry, f"/v2/{name}/blobs/{layer['digest']}") == sbom_file.read_bytes()
