"""Our image as tools/chart/push.sh (the push step of `./dev release`) leaves it in the simulator's
registry:

- its SBOM attached as an OCI 1.1 referrer: the referrers API lists one artifact for the image's
  manifest digest, a CycloneDX artifact whose layer is `./dev image`'s SBOM file byte for byte;
- signed with --sign-image (what `./dev release --sign` passes: containers' simple signing by the
  release's OpenPGP key, signatures in a lookaside directory) and checked with
  tools/chart/verify_image.sh (skopeo's policy engine with a signedBy policy): the signed image
  verifies with the signer's public key; another key and an image pushed unsigned are refused,
  each with a line naming what to fix."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_operator import __version__
from gpu_operator.sim.plane.registry import Registry
from gpu_operator.sim.realnode.realnode import image_archive
from tests.support.gpgkey import make_key

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "chart"
SBOM = "application/vnd.cyclonedx+json"


@dataclass(frozen=True)
class Release:
    """What push.sh needs beside the image: a packaged chart, the registry's CA and credentials."""

    registry: Registry
    charts: Path
    access: list[str]  # --ca-file CA --creds-file FILE
    env: dict[str, str]  # helm's config, cache and login under the test's directory

    def push(self, path: str, *extra: str) -> subprocess.CompletedProcess[str]:
        argv = [
            str(TOOLS / "push.sh"),
            f"{self.registry.host}/{path}",
            *self.access,
            "--charts",
            str(self.charts),
        ]
        done = subprocess.run(
            [*argv, *extra], env=self.env, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr
        return done


def _release(registry: Registry, tmp_path: Path) -> Release:
    image_archive()  # dist/'s OCI archive, built with the docker-archive, current with the sources
    charts = tmp_path / "charts"
    subprocess.run(
        [sys.executable, str(TOOLS / "release.py"), "--out", str(charts)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    creds = tmp_path / "creds"
    creds.write_text(f"{registry.user}:{registry.password}")
    helm_homes = {f"HELM_{k}_HOME": str(tmp_path / "helm" / k.lower()) for k in ("CONFIG", "CACHE", "DATA")}
    return Release(
        registry,
        charts,
        ["--ca-file", str(registry.ca_cert), "--creds-file", str(creds)],
        {**os.environ, **helm_homes},
    )


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
    release = _release(registry, tmp_path)
    archive = REPO / "dist" / f"gpu-operator-{__version__}.oci.tar"
    sbom_file = archive.with_name(f"gpu-operator-{__version__}.sbom.cdx.json")
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        assert index is not None
        image_digest = json.load(index)["manifests"][0]["digest"]
    pushed = release.push("sbom")

    name = "sbom/gpu-operator-py/gpu-operator"
    referrers = json.loads(
        _get(registry, f"/v2/{name}/referrers/{image_digest}", "application/vnd.oci.image.index.v1+json")
    )
    # one referrer. (go-containerregistry's registry lists a referrer's config.mediaType as its
    # artifactType, not the manifest's artifactType field: the manifest below is read for that.)
    (listed,) = referrers["manifests"]
    artifact_digest = listed["digest"]
    assert f"push: SBOM {artifact_digest} attached to {image_digest}" in pushed.stderr.splitlines()
    accept = "application/vnd.oci.image.manifest.v1+json"
    manifest: dict[str, Any] = json.loads(_get(registry, f"/v2/{name}/manifests/{artifact_digest}", accept))
    assert manifest["subject"]["digest"] == image_digest
    assert manifest["artifactType"] == SBOM
    (layer,) = manifest["layers"]
    assert layer["annotations"]["org.opencontainers.image.title"] == sbom_file.name
    assert _get(registry, f"/v2/{name}/blobs/{layer['digest']}") == sbom_file.read_bytes()


def test_a_signed_image_verifies_and_an_unsigned_or_foreign_one_is_refused(
    registry: Registry, tmp_path: Path
) -> None:
    release = _release(registry, tmp_path)
    ours, other = (
        make_key(tmp_path / "ours", "gpu-operator release"),
        make_key(tmp_path / "other", "someone else"),
    )
    signatures = tmp_path / "signatures"

    def verify(path: str, key: Path) -> subprocess.CompletedProcess[str]:
        ref = f"{registry.host}/{path}/gpu-operator-py/gpu-operator:{__version__}"
        argv = [str(TOOLS / "verify_image.sh"), ref, "--key", str(key), "--signatures", str(signatures)]
        return subprocess.run(
            [*argv, *release.access], capture_output=True, text=True, timeout=300, check=False
        )

    release.push(
        "signed", "--sign-image", ours.name, "--keyring", str(ours.secring), "--signatures", str(signatures)
    )
    release.push("unsigned")

    signed = verify("signed", ours.pubring)
    assert signed.returncode == 0, signed.stderr
    (line,) = signed.stdout.splitlines()
    ref = f"{registry.host}/signed/gpu-operator-py/gpu-operator:{__version__}"
    digest = line.split(" ")[2].strip("()")
    assert line == f"verify: {ref} ({digest}) is signed by a key in {ours.pubring}"

    foreign = verify("signed", other.pubring)
    assert foreign.returncode == 1
    assert foreign.stderr.splitlines()[-1] == (
        f"verify: {ref} ({digest}) is signed, but by no key in --key {other.pubring}: "
        "use the publisher's public key (gpg --export KEY > PUBRING)"
    )
    unsigned = verify("unsigned", ours.pubring)
    assert unsigned.returncode == 1
    assert unsigned.stderr.splitlines()[-1] == (
        f"verify: {registry.host}/unsigned/gpu-operator-py/gpu-operator:{__version__} ({digest}) has no signature "
        f"in --signatures {signatures}: push it signed (./dev release --sign KEY --keyring SECRING), or point "
        "--signatures at its publisher's signatures"
    )
