"""Registry credentials never reach a command line, and verify_image.sh names only the digest it
verified. tools/chart/push.sh (what `./dev release` runs) and tools/chart/verify_image.sh run
under strace against stand-ins for skopeo, helm and Python that record what they were handed:
no program started (skopeo, helm, cat, tr, base64, anything) has the password, nor the base64 of
USER:PASSWORD, in its arguments; skopeo and helm get an auth file that holds them; and
verify_image.sh copies REPOSITORY@DIGEST, the digest of the manifest it read, which is the one
it prints, so a tag that moves between the two reads cannot make it name another image.
(The whole release against a real registry: tests/integration/test_registry_release_image.py.)"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "tools" / "chart"
VERSION = yaml.safe_load((REPO / "deployments/gpu-operator/Chart.yaml").read_text())["appVersion"]
MANIFEST = '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}'
AUTH_FLAGS = ("--authfile", "--src-authfile", "--dest-authfile", "--registry-config")

# A stand-in: records its argv (one JSON line) and the content of any auth file it is handed;
# skopeo's `inspect --raw` answers the manifest above.
STANDIN = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
files = {a: open(args[i + 1]).read() for i, a in enumerate(args[:-1]) if a in AUTH_FLAGS}
with open(os.environ["STANDIN_LOG"], "a") as log:
    log.write(json.dumps({"tool": os.path.basename(sys.argv[0]), "args": args, "files": files}) + "\\n")
if os.path.basename(sys.argv[0]) == "skopeo" and "inspect" in args:
    sys.stdout.write(MANIFEST)
""".replace("AUTH_FLAGS", repr(AUTH_FLAGS)).replace("MANIFEST", repr(MANIFEST))


def _strace() -> str:
    found = shutil.which("strace")
    assert found, "strace is needed to record the command lines (apt-get install strace; ./dev installs it)"
    return found


def _run(
    argv: list[str], tmp_path: Path, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """Run under strace; the argv of every program it started (execve), and the result."""
    trace = tmp_path / "execve.log"
    done = subprocess.run(
        [_strace(), "-f", "-qq", "-e", "trace=execve", "-s", "65536", "-o", str(trace), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    execs = []
    for line in trace.read_text().splitlines():
        match = re.search(r'execve\("[^"]*", \[(.*)\], ', line)
        if match:
            execs.append(json.loads(f"[{match.group(1)}]"))
    assert execs, trace.read_text()
    return done, execs


@dataclass(frozen=True)
class Site:
    creds: Path  # USER:PASSWORD
    user: str
    password: str
    env: dict[str, str]  # the stand-ins first on PATH, as helm and Python
    log: Path  # what the stand-ins were handed


@pytest.fixture
def site(tmp_path: Path) -> Site:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("skopeo", "helm", "python"):
        (bin_dir / tool).write_text(STANDIN)
        (bin_dir / tool).chmod(0o755)
    user, password = "release-bot", "pw-" + secrets.token_urlsafe(16)
    creds = tmp_path / "creds"
    creds.write_text(f"{user}:{password}\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STANDIN_LOG": str(tmp_path / "standin.log"),
        "GPU_OPERATOR_HELM": str(bin_dir / "helm"),
        "PYTHON": str(bin_dir / "python"),
    }
    return Site(creds, user, password, env, tmp_path / "standin.log")


def _standins(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _no_credential_in(execs: list[list[str]], user: str, password: str) -> None:
    secrets_ = (password, base64.b64encode(f"{user}:{password}".encode()).decode())
    leaked = [argv for argv in execs if any(s in arg for s in secrets_ for arg in argv)]
    assert not leaked, leaked


def _auth_file_holds(files: dict[str, str], host: str, user: str, password: str) -> None:
    (content,) = files.values()
    auth = json.loads(content)["auths"][host]["auth"]
    assert base64.b64decode(auth).decode() == f"{user}:{password}"


def test_push_hands_the_credentials_to_skopeo_and_helm_in_an_auth_file(site: Site, tmp_path: Path) -> None:
    dist, charts = tmp_path / "dist", tmp_path / "charts"
    dist.mkdir()
    charts.mkdir()
    (dist / f"gpu-operator-{VERSION}.oci.tar").write_bytes(b"")
    (charts / f"gpu-operator-{VERSION}.tgz").write_bytes(b"")
    done, execs = _run(
        [
            str(TOOLS / "push.sh"),
            "registry.example:5000/rel",
            "--creds-file",
            str(site.creds),
            "--dist",
            str(dist),
            "--charts",
            str(charts),
        ],
        tmp_path,
        site.env,
    )
    assert done.returncode == 0, done.stderr
    _no_credential_in(execs, site.user, site.password)
    calls = {c["tool"]: c for c in _standins(site.log)}
    assert set(calls) == {"skopeo", "helm", "python"}, calls
    assert "--dest-authfile" in calls["skopeo"]["args"]
    _auth_file_holds(calls["skopeo"]["files"], "registry.example:5000", site.user, site.password)
    assert calls["helm"]["args"][0] == "push" and "--registry-config" in calls["helm"]["args"]
    _auth_file_holds(calls["helm"]["files"], "registry.example:5000", site.user, site.password)
    assert calls["python"]["args"][-2:] == ["--creds-file", str(site.creds)]  # attach_sbom.py reads the file


def test_verify_reads_with_an_auth_file_and_verifies_the_digest_it_prints(site: Site, tmp_path: Path) -> None:
    key = tmp_path / "pubring.gpg"
    key.write_bytes(b"")
    signatures = tmp_path / "signatures"
    signatures.mkdir()
    repository = "registry.example:5000/rel/gpu-operator-py/gpu-operator"
    ref = f"{repository}:{VERSION}"
    done, execs = _run(
        [
            str(TOOLS / "verify_image.sh"),
            ref,
            "--key",
            str(key),
            "--signatures",
            str(signatures),
            "--creds-file",
            str(site.creds),
        ],
        tmp_path,
        site.env,
    )
    assert done.returncode == 0, done.stderr
    _no_credential_in(execs, site.user, site.password)
    inspect, copy = _standins(site.log)
    digest = "sha256:" + hashlib.sha256(MANIFEST.encode()).hexdigest()
    assert done.stdout.splitlines() == [f"verify: {ref} ({digest}) is signed by a key in {key}"]
    assert inspect["args"][:2] == ["inspect", "--raw"] and inspect["args"][-1] == f"docker://{ref}"
    _auth_file_holds(inspect["files"], "registry.example:5000", site.user, site.password)
    # what passed the policy is the image by that digest, not whatever the tag names by then
    assert "copy" in copy["args"] and f"docker://{repository}@{digest}" in copy["args"], copy["args"]
    assert f"docker://{ref}" not in copy["args"]
    _auth_file_holds(copy["files"], "registry.example:5000", site.user, site.password)
