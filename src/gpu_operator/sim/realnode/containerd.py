"""A private containerd (with runc from Debian's packages) under a directory we own.

Never the machine's default /run/containerd or /var/lib/containerd: root, state, the gRPC
socket, the FIFOs of `ctr run` and containerd's log all live under ``base_dir``. Use it to run
our image's entrypoints in real containers, or as a node's container runtime (set ``cri=True``
and point a kubelet at ``endpoint``)::

    with PrivateContainerd(tmp / "ctrd") as ctrd:         # start() ... stop()
        refs = ctrd.import_image(Path("dist/gpu-operator-0.1.0.docker.tar"))
        result = ctrd.run(refs[0], ["gpu-operator", "--help"],
                          env={"COMPONENT": "driver"}, mounts=[Mount("/srv/host", "/host")])
        assert result.ok, result.describe()

Needs root (containerd and runc do). What remains outside ``base_dir`` is containerd 1.6's
own fixed choice: the runc shims' sockets under /run/containerd/s/ (hashed names, no clash
with a system containerd) and runc's state under /run/containerd/runc/<namespace>.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator.sim.plane.processes import stop_group, tail

DEBIAN_PACKAGES = ("containerd", "runc")
DEFAULT_NAMESPACE = "gpu-operator"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


MAX_SOCKET_PATH = 104  # bytes: containerd refuses a longer unix socket path (the BSD limit it applies)


class ContainerdError(RuntimeError):
    """containerd or ctr failed; the message says what ran, why it failed and the log's tail."""


@dataclass(frozen=True)
class Mount:
    """A bind mount of a host directory into the container (read-only unless told)."""

    source: str | Path
    target: str
    readonly: bool = True

    def ctr_arg(self) -> str:
        opts = "rbind:ro" if self.readonly else "rbind:rw"
        return f"type=bind,src={self.source},dst={self.target},options={opts}"


@dataclass(frozen=True)
class RunResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        return (
            f"`{' '.join(self.argv)}` exited {self.returncode}\n--- stdout\n{self.stdout}"
            f"\n--- stderr\n{self.stderr}"
        )


def missing_binaries() -> list[str]:
    """The binaries this launcher needs that are not on PATH (plus the sbin directories)."""
    need = ("containerd", "ctr", "containerd-shim-runc-v2", "runc")
    return [b for b in need if shutil.which(b, path=_PATH) is None]


def _overlay_supported() -> bool:
    try:
        return "overlay" in Path("/proc/filesystems").read_text()
    except OSError:
        return False


@dataclass
class PrivateContainerd:
    """start() / stop() a containerd of our own; import_image(), run() and ctr() talk to it.

    ``snapshotter``: "overlayfs" when the kernel has overlay, else "native" (copies; slower).
    ``cri``: keep containerd's CRI plugin (for a kubelet); off by default, since plain `ctr`
    runs do not need it. ``extra_config``: TOML appended to the generated config.toml.
    ``launcher``: an argv prefix containerd is started with (e.g. `nsenter ...` into the real
    node's namespaces).
    """

    base_dir: Path
    namespace: str = DEFAULT_NAMESPACE
    snapshotter: str = ""
    cri: bool = False
    extra_config: str = ""
    launcher: Sequence[str] = ()
    start_timeout: float = 30.0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).absolute()
        if not self.snapshotter:
            self.snapshotter = "overlayfs" if _overlay_supported() else "native"

    # --- where things are --------------------------------------------------------------
    @property
    def socket(self) -> Path:
        return self.base_dir / "containerd.sock"

    @property
    def endpoint(self) -> str:
        """The CRI / gRPC endpoint, e.g. for kubelet's --container-runtime-endpoint."""
        return f"unix://{self.socket}"

    @property
    def log(self) -> Path:
        return self.base_dir / "containerd.log"

    @property
    def config_path(self) -> Path:
        return self.base_dir / "config.toml"

    def config_toml(self) -> str:
        disabled = [] if self.cri else ['"io.containerd.grpc.v1.cri"']
        return "\n".join(
            [
                "version = 2",
                f'root = "{self.base_dir / "root"}"',
                f'state = "{self.base_dir / "state"}"',
                f"disabled_plugins = [{', '.join(disabled)}]",
                "[grpc]",
                f'  address = "{self.socket}"',
                "[ttrpc]",
                f'  address = "{self.base_dir / "ttrpc.sock"}"',
                "[debug]",
                '  address = ""',
                '  level = "info"',
                "[metrics]",
                '  address = ""',
                "",
                self.extra_config,
            ]
        )

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        longest = self.base_dir / "ttrpc.sock"
        if len(str(longest).encode()) > MAX_SOCKET_PATH:
            raise ContainerdError(
                f"cannot start containerd in {self.base_dir}: its socket {longest} would be {len(str(longest).encode())} "
                f"bytes long, and a unix socket path may be {MAX_SOCKET_PATH} at most: use a shorter directory "
                "(e.g. `gpu-operator sim up --dir /tmp/sim`)"
            )
        missing = missing_binaries()
        if missing:
            raise ContainerdError(
                f"cannot start containerd: {', '.join(missing)} not found on PATH. Install the "
                f"Debian packages {' '.join(DEBIAN_PACKAGES)} (`./dev setup` does it as root)."
            )
        if os.geteuid() != 0:
            raise ContainerdError(
                "cannot start containerd: it needs root (mounts, cgroups, namespaces); "
                f"this process runs as uid {os.geteuid()}"
            )
        for sub in ("root", "state", "fifo"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_toml())
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [*self.launcher, "containerd", "--config", str(self.config_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PATH": _PATH},
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ContainerdError(
                    f"containerd exited with code {self.process.returncode} at start; "
                    f"log {self.log}:\n{tail(self.log, 30)}"
                )
            if self.socket.exists() and self._ctr(["version"], check=False).returncode == 0:
                return
            time.sleep(0.2)
        self.stop()
        raise ContainerdError(
            f"containerd did not answer on {self.socket} within {self.start_timeout:.0f}s; "
            f"log {self.log}:\n{tail(self.log, 30)}"
        )

    def stop(self, timeout: float = 15.0) -> None:
        """Remove our containers' tasks, then stop containerd (its data stays under base_dir)."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ContainerdError, OSError, subprocess.SubprocessError):
            for task in self._ctr(["tasks", "ls", "-q"], check=False).stdout.split():
                self._ctr(["tasks", "kill", "-s", "SIGKILL", task], check=False)
                self._ctr(["tasks", "rm", "-f", task], check=False)
            for ctn in self._ctr(["containers", "ls", "-q"], check=False).stdout.split():
                self._ctr(["containers", "rm", ctn], check=False)
        stop_group(proc, timeout)
        self.process = None

    def __enter__(self) -> PrivateContainerd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log, lines)

    # --- talking to it ----------------------------------------------------------------
    def _ctr(
        self, args: Sequence[str], *, check: bool = True, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(self.socket), "--namespace", self.namespace, *args]
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, "PATH": _PATH},
        )
        if check and done.returncode != 0:
            raise ContainerdError(
                f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}\n"
                f"containerd log {self.log}:\n{self.log_tail(15)}"
            )
        return done

    def ctr(self, *args: str, timeout: float = 300.0) -> str:
        """Run any `ctr` subcommand against this containerd; returns stdout, raises on failure."""
        return self._ctr(args, timeout=timeout).stdout

    def import_image(self, archive: Path, *, base_name: str | None = None) -> list[str]:
        """`ctr images import` a docker-archive or OCI archive; returns the image names it added.

        ``base_name`` (e.g. ``ghcr.io/org/image``) names an OCI archive's images, whose index
        carries only tags; a docker-archive names them itself.
        """
        before = set(self.images())
        args = ["images", "import", "--snapshotter", self.snapshotter]
        if base_name:
            args += ["--base-name", base_name]
        self._ctr([*args, str(Path(archive).absolute())])
        after = self.images()
        new = [r for r in after if r not in before]
        return new or after

    def image_digest(self, ref: str) -> str:
        """The manifest digest containerd holds for ``ref``."""
        for line in self._ctr(["images", "ls"]).stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == ref:
                return fields[2]
        raise ContainerdError(f"containerd at {self.socket} has no image {ref}; it has {self.images()}")

    def images(self) -> list[str]:
        return self._ctr(["images", "ls", "-q"]).stdout.split()

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        name: str | None = None,
        timeout: float = 120.0,
    ) -> RunResult:
        """Run ``argv`` in a fresh container of ``image`` (its user, env and workdir apply),
        wait for it and remove it. A non-zero exit is a result, not an error; failing to
        create or start the container raises ContainerdError."""
        cid = name or f"run-{os.getpid()}-{time.monotonic_ns()}"
        args = ["run", "--rm", "--snapshotter", self.snapshotter, "--fifo-dir", str(self.base_dir / "fifo")]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        for m in mounts:
            args += ["--mount", m.ctr_arg()]
        args += [image, cid, *argv]
        try:
            done = self._ctr(args, check=False, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            with contextlib.suppress(subprocess.SubprocessError):
                self._ctr(["tasks", "kill", "-s", "SIGKILL", cid], check=False)
                self._ctr(["tasks", "rm", "-f", cid], check=False)
                self._ctr(["containers", "rm", cid], check=False)
            raise ContainerdError(
                f"container {cid} ({' '.join(argv)}) did not finish in {timeout:.0f}s"
            ) from err
        if done.returncode != 0 and done.stderr.startswith("ctr: "):
            # ctr's own failure (image missing, runc refused, mount failed), not the program's
            raise ContainerdError(
                f"could not run {' '.join(argv)} in {image}: {done.stderr.strip()}\n"
                f"containerd log {self.log}:\n{self.log_tail(15)}"
            )
        return RunResult(tuple(argv), done.returncode, done.stdout, done.stderr)


def hosts_toml(host: str, ca_cert: Path) -> str:
    """containerd's registry host configuration (certs.d/<host>/hosts.toml) for ``host`` over
    HTTPS, trusting ``ca_cert``."""
    return "\n".join(
        [
            f'server = "https://{host}"',
            "",
            f'[host."https://{host}"]',
            '  capabilities = ["pull", "resolve"]',
            f'  ca = "{ca_cert}"',
            "",
        ]
    )
