"""The simulator's OCI registry: tools/registry (go-containerregistry's registry handler, built
from Go modules) over TLS with a serving certificate from the simulator's CA, and HTTP basic auth
against an htpasswd file of bcrypt hashes. Blobs live on disk under ``base_dir``, manifests and
tags in the process's memory (gone when it stops: push again after a restart).

    registry = Registry(tmp / "registry", pki_dir).start()
    registry.host                  # "127.0.0.1:PORT": the image references' registry part
    registry.login_args()          # skopeo/helm flags with the credentials and the CA
    registry.stop()

The real node reaches it at the same address (``RealNode.trust_registry``): containerd's registry
host configuration names the simulator's CA, and a forwarder inside the node's network carries
127.0.0.1:PORT there to the registry here.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator.sim.plane import pki as pki_mod
from gpu_operator.sim.plane.binaries import build_script

ENV = "GPU_OPERATOR_REGISTRY"
USER = "gpu-operator"
READY_LINE = "serving https://"


class RegistryError(RuntimeError):
    """The registry could not be built or started; the message says why and what to do."""


def locate() -> Path:
    """$GPU_OPERATOR_REGISTRY if set, else the build script's binary (built once, then cached)."""
    if os.environ.get(ENV):
        binary = Path(os.environ[ENV])
        if not os.access(binary, os.X_OK):
            raise RegistryError(
                f"${ENV}={binary} is not an executable: unset it or run tools/registry/build.sh"
            )
        return binary
    script = build_script("registry")
    if script is None:
        raise RegistryError(
            f"the registry is not built: set ${ENV} to the binary tools/registry/build.sh "
            "prints (from a source checkout of gpu-operator)"
        )
    done = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RegistryError(f"building the registry failed ({script}); see the messages above")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class Registry:
    """start() / stop() the registry; ``host``, ``user``, ``password`` and ``ca_cert`` are what a
    client needs. ``password``: a fresh random one unless given."""

    base_dir: Path
    pki_dir: Path
    user: str = USER
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    binary: Path | None = None
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).absolute()

    @property
    def log(self) -> Path:
        return self.base_dir / "registry.log"

    @property
    def host(self) -> str:
        if not self.port:
            raise RegistryError("the registry is not started")
        return f"127.0.0.1:{self.port}"

    @property
    def ca_cert(self) -> Path:
        return pki_mod.Pki(self.pki_dir).ca_cert

    @property
    def cert_dir(self) -> Path:
        """A directory holding only the CA as ca.crt (skopeo's --cert-dir, containerd's hosts dir)."""
        return self.base_dir / "certs"

    def start(self, timeout: float = 30.0) -> Registry:
        binary = self.binary or locate()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.cert_dir.mkdir(exist_ok=True)
        (self.cert_dir / "ca.crt").write_bytes(self.ca_cert.read_bytes())
        cert, key = pki_mod.issue_serving_cert(
            pki_mod.Pki(self.pki_dir), "registry", "gpu-operator-sim-registry", ["127.0.0.1"], ["localhost"]
        )
        hashed = subprocess.run(
            [str(binary), "htpasswd", self.user],
            input=self.password,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if hashed.returncode != 0:
            raise RegistryError(f"`registry htpasswd` failed: {hashed.stderr.strip()}")
        htpasswd = self.base_dir / "htpasswd"
        htpasswd.write_text(hashed.stdout)
        htpasswd.chmod(0o600)
        argv = [
            str(binary),
            "serve",
            f"--addr=127.0.0.1:{self.port}",
            f"--tls-cert={cert}",
            f"--tls-key={key}",
            f"--htpasswd={htpasswd}",
            f"--storage={self.base_dir / 'blobs'}",
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.log.read_text(errors="replace").splitlines()
            served = [ln for ln in lines if ln.startswith(READY_LINE)]
            if served:
                self.port = int(served[-1].rsplit(":", 1)[1])
                return self
            if self.process.poll() is not None:
                raise RegistryError(
                    f"the registry exited with code {self.process.returncode} at start; "
                    f"log {self.log}:\n" + "\n".join(lines[-20:])
                )
            time.sleep(0.1)
        self.stop()
        raise RegistryError(f"the registry did not start within {timeout:.0f}s; log {self.log}")

    def stop(self, timeout: float = 10.0) -> None:
        from gpu_operator.sim.realnode.realnode import terminate

        proc, self.process = self.process, None
        if proc is not None:
            terminate(proc, timeout)

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def requests(self) -> list[dict[str, str]]:
        """The requests served so far, from its log: method, path, user, status (one dict each)."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            fields = line.split()
            if len(fields) == 6 and fields[4].startswith("user=") and fields[5].startswith("status="):
                found.append(
                    {
                        "method": fields[2],
                        "path": fields[3],
                        "user": fields[4].removeprefix("user="),
                        "status": fields[5].removeprefix("status="),
                    }
                )
        return found

    def push_archive(self, archive: Path, repository: str, tag: str, *, fmt: str = "docker-archive") -> str:
        """skopeo copy an image archive (docker-archive or oci-archive) to REPOSITORY:TAG here (all of
        an OCI index's platforms); returns the reference pushed."""
        ref = f"{self.host}/{repository}:{tag}"
        argv = [
            "skopeo",
            "copy",
            "--quiet",
            "--all",
            f"--dest-cert-dir={self.cert_dir}",
            f"--dest-authfile={self.auth_file()}",  # the password never on a command line
            f"{fmt}:{archive}",
            f"docker://{ref}",
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
        if done.returncode != 0:
            raise RegistryError(f"pushing {archive} to {ref} failed: {done.stderr.strip()}")
        return ref

    def auth_file(self) -> Path:
        """This registry's login as a containers auth file (owner-only), for skopeo's
        --authfile: what a command line would otherwise carry."""
        import base64
        import json

        path = self.base_dir / "auth.json"
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        path.write_text(json.dumps({"auths": {self.host: {"auth": auth}}}))
        return path

    def docker_config(self, password: str | None = None) -> dict[str, object]:
        """A .dockerconfigjson for this registry (an imagePullSecret's content); ``password`` another
        one than the registry's (a wrong secret)."""
        import base64

        secret = password if password is not None else self.password
        auth = base64.b64encode(f"{self.user}:{secret}".encode()).decode()
        return {"auths": {self.host: {"username": self.user, "password": secret, "auth": auth}}}
