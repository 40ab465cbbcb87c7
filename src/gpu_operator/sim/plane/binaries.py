"""Finds (or builds) the Go-built control-plane binaries in the versioned cache."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

ENV = "GPU_OPERATOR_CONTROLPLANE"
KUBERNETES = ("current", "floor")
"""Which Kubernetes the control plane runs: the current one (tools/controlplane/versions.env) or
the oldest we support (tools/controlplane/kube-floor/version.env, the chart's kubeVersion floor;
no kubelet, so no real node)."""


class BinariesMissing(RuntimeError):
    """The control plane is not built and cannot be built from here; the message says how."""


@dataclass(frozen=True)
class Binaries:
    root: Path
    kubernetes: str = "current"

    @property
    def kube(self) -> Path:
        """The apiserver/controller-manager/scheduler (and, current only, kubelet) multicall binary."""
        return self.root / "bin" / ("kube" if self.kubernetes == "current" else "kube-floor")

    def of(self, kubernetes: str) -> Binaries:
        """The same cache with the control plane of `kubernetes` ("current" or "floor")."""
        if kubernetes not in KUBERNETES:
            raise BinariesMissing(f"unknown Kubernetes {kubernetes!r}: choose one of {', '.join(KUBERNETES)}")
        return replace(self, kubernetes=kubernetes)

    @property
    def pause(self) -> Path:
        """The real node's sandbox process (packed into a local pause image)."""
        return self.root / "bin" / "pause"

    @property
    def etcd(self) -> Path:
        return self.root / "bin" / "etcd"

    @property
    def kwok(self) -> Path:
        return self.root / "bin" / "kwok"

    def stages_yaml(self) -> str:
        """kwok's default fast stages (node initialize, lease heartbeat, pod ready/complete/delete)."""
        files = sorted((self.root / "stages").glob("*.yaml"))
        return "\n---\n".join(f.read_text().strip().removeprefix("---").strip() for f in files) + "\n"

    def complete(self, kubernetes: str | None = None) -> bool:
        """Everything a control plane of `kubernetes` needs is built (None: both Kubernetes)."""
        kubes = KUBERNETES if kubernetes is None else (self.of(kubernetes).kubernetes,)
        binaries = (*(self.of(k).kube for k in kubes), self.etcd, self.kwok)
        return (
            all(p.is_file() and os.access(p, os.X_OK) for p in binaries) and (self.root / "stages").is_dir()
        )


def build_script(tool: str = "controlplane") -> Path | None:
    """tools/<tool>/build.sh of the source checkout this package runs from, if any."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "tools" / tool / "build.sh"
        if candidate.is_file():
            return candidate
    return None


def locate(build: bool = True, kubernetes: str = "current") -> Binaries:
    """The binaries of the `kubernetes` control plane: $GPU_OPERATOR_CONTROLPLANE if set, else run
    the build script (a no-op when cached). The current Kubernetes never waits for the floor's
    build, which only tests/floor needs."""
    if os.environ.get(ENV):
        binaries = Binaries(Path(os.environ[ENV])).of(kubernetes)
        if not binaries.complete(kubernetes):
            raise BinariesMissing(
                f"${ENV}={binaries.root} does not hold {binaries.kube.relative_to(binaries.root)}, bin/etcd, "
                "bin/kwok and stages/: unset it or run tools/controlplane/build.sh"
                + (" --without-floor" if kubernetes == "current" else "")
            )
        return binaries
    script = build_script()
    if script is None or not build:
        raise BinariesMissing(
            f"the test control plane is not built: set ${ENV} to a directory made by "
            "tools/controlplane/build.sh (from a source checkout of gpu-operator)"
        )
    # The script prints progress on stderr (passed through) and the cache dir last on stdout.
    args = ["bash", str(script), *(["--without-floor"] if kubernetes == "current" else [])]
    result = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise BinariesMissing(f"building the control plane failed ({script}); see the messages above")
    binaries = Binaries(Path(result.stdout.strip().splitlines()[-1])).of(kubernetes)
    if not binaries.complete(kubernetes):
        raise BinariesMissing(f"{script} finished but {binaries.root} is incomplete")
    return binaries
