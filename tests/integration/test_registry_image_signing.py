"""Our image signed as it is pushed (tools/chart/push.sh --sign-image, what `./dev release --sign`
runs: containers' simple signing by the release's OpenPGP key, signatures in the release's
signatures/ directory) and checked with tools/chart/verify_image.sh (skopeo's policy engine with a
signedBy policy): the signed image verifies with the signer's public key; another key and an image
pushed unsigned are refused, each with a line naming what to fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpu_operator import __version__
from gpu_operator.sim.realnode import image_archive
from gpu_operator.sim.registry import Registry
from tests.support.gpgkey import make_key

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "chart"


def test_a_signed_image_verifies_and_an_unsigned_or_foreign_one_is_refused(
    registry: Registry, tmp_path: Path
) -> None:
    image_archive()  # dist/'s OCI archive current with the sources
    ours, other = (
        make_key(tmp_path / "ours", "gpu-operator release"),
        make_key(tmp_path / "other", "someone else"),
    )
    charts, signatures = tmp_path / "charts", tmp_path / "signatures"
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "chart" / "release.py"), "--out", str(charts)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    creds = tmp_path / "creds"
    creds.write_text(f"{registry.user}:{registry.password}")
    access = ["--ca-file", str(registry.ca_cert), "--creds-file", str(creds)]
    env = {
        **os.environ,
        **{f"HELM_{k}_HOME": str(tmp_path / "helm" / k.lower()) for k in ("CONFIG", "CACHE", "DATA")},
    }

    def push(path: str, *sign: str) -> None:
        argv = [str(TOOLS / "push.sh"), f"{registry.host}/{path}", *access, "--charts", str(charts), *sign]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr

    def verify(path: str, key: Path) -> subprocess.CompletedProcess[str]:
        ref = f"{registry.host}/{path}/gpu-operator-py/gpu-operator:{__version__}"
        argv = [
            str(TOOLS / "verify_image.sh"),
            ref,
            "--key",
            str(key),
            "--signatures",
            str(signatures),
            *access,
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)

    push("signed", "--sign-image", ours.name, "--keyring", str(ours.secring), "--signatures", str(signatures))
    push("unsigned")

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
