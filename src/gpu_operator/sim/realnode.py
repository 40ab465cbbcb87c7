"""A real node for the simulator: the kubelet (from the control plane's multicall binary) and
Debian's containerd + runc, registered with the simulator's apiserver, running real pods.

Everything lives under ``base_dir`` (containerd root/state/socket, the kubelet's root dir, its
certificates, pod logs, CNI state) or inside the node's namespace sandbox (see `nodens`); the
kubelet's cgroups are created under ``/<hierarchy>/gpu-operator-sim/<node>`` and removed on stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.sim import cudasample, egress, nvruntime, pluginimage
from gpu_operator.sim import pki as pki_mod
from gpu_operator.sim.binaries import Binaries
from gpu_operator.sim.containerd import PrivateContainerd
from gpu_operator.sim.kubeconfig import write_kubeconfig
from gpu_operator.sim.nodens import NODE_IP, POD_SUBNET, SERVICE_IP, SHORT_ROOT, Sandbox, proxy_argv
from gpu_operator.sim.ociarchive import write_archive

PAUSE_IMAGE = "localhost/gpu-operator-sim/pause:1"
CGROUP_PARENT = "gpu-operator-sim"
CGROUP_FS = Path("/sys/fs/cgroup")
CRI_NAMESPACE = "k8s.io"
# The kubelet's device-plugin directory (fixed in the kubelet, not under --root-dir).
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


class RealNodeError(RuntimeError):
    """The real node did not come up; the message names the component and its log's tail."""


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def cgroup_name(node: str, base_dir: Path) -> str:
    """The node's cgroup directory name: its name and its directory's, so that two real nodes
    (two test sessions, a test session and `sim up`) never share cgroups."""
    import hashlib

    return f"{node}-{hashlib.sha256(str(Path(base_dir).absolute()).encode()).hexdigest()[:8]}"


def cgroup_dirs(node: str) -> list[Path]:
    """The node's cgroup root in every mounted v1 hierarchy (or the v2 mount)."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS / CGROUP_PARENT / node]
    return [h / CGROUP_PARENT / node for h in sorted(CGROUP_FS.iterdir())
            if h.is_dir() and not h.is_symlink() and (h / "cgroup.procs").exists()]


def make_cgroups(node: str) -> None:
    for leaf in cgroup_dirs(node):
        for level in (leaf.parent, leaf):
            if level.exists():
                continue
            level.mkdir()
            # A v1 cpuset child starts empty and takes no tasks until given cpus and mems.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (level / knob).exists():
                    (level / knob).write_text((level.parent / knob).read_text())


def cgroup_pids(leaf: Path) -> set[int]:
    pids: set[int] = set()
    for procs in leaf.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(pid) for pid in procs.read_text().split())
    return pids


def kill_cgroup_members(node: str, timeout: float = 15.0) -> set[int]:
    """SIGKILL every process left in the node's cgroups (containers live in mount namespaces of
    their own, so only their cgroups find them all) until none is left; returns the pids seen."""
    leaves = [leaf for leaf in cgroup_dirs(node) if leaf.exists()]
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while (pids := set().union(*(cgroup_pids(leaf) for leaf in leaves))) and time.monotonic() < deadline:
        seen |= pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return seen


def remove_cgroups(node: str) -> list[str]:
    """Kill what is left in the node's cgroup trees, then rmdir them bottom-up; returns what could
    not be removed."""
    kill_cgroup_members(node)
    left = []
    for leaf in cgroup_dirs(node):
        if not leaf.exists():
            continue
        for path in sorted((p for p in leaf.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                path.rmdir()
        for level in (leaf, leaf.parent):
            try:
                level.rmdir()
            except OSError:
                if level == leaf:
                    left.append(str(level))
    return left


def kubelet_config(base: Path, ca: Path, endpoint: str, serving: tuple[Path, Path]) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # cgroup v1 hosts: 1.35+ refuses them unless told (the default is true).
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs", "cgroupsPerQOS": True,
        "containerRuntimeEndpoint": endpoint,
        "address": NODE_IP, "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        # Its API, reached by the apiserver through the egress proxy: a serving certificate from
        # the simulator's CA (the apiserver verifies it), clients with a certificate of that CA
        # only (the apiserver's kubelet client), no anonymous access.
        "tlsCertFile": str(serving[0]), "tlsPrivateKeyFile": str(serving[1]),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(base / "pod-logs"),
        "failSwapOn": False, "protectKernelDefaults": False,
        "resolvConf": "", "clusterDomain": "cluster.local",
        "maxPods": 40, "serializeImagePulls": False,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "5s", "syncFrequency": "10s",
        "fileCheckFrequency": "60s", "httpCheckFrequency": "60s",
        "shutdownGracePeriod": "0s", "logging": {"format": "text"},
    }


def containerd_cri_config(base: Path, nvidia_binary: Path | None = None) -> str:
    """CRI settings; the `nvidia` handler runs `nvidia_binary` (see `nvruntime`) instead of runc
    when given, plain runc otherwise."""
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return "\n".join([
        cri,
        f'  sandbox_image = "{PAUSE_IMAGE}"',
        "  enable_selinux = false",
        # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which root lacks on these machines (runc:
        # "failed to update /proc/self/oom_score_adj: Permission denied"): clamp to our own.
        "  restrict_oom_score_adj = true",
        f"{cri[:-1]}.containerd]",
        '  default_runtime_name = "runc"',
        f'{cri[:-1]}.containerd.runtimes.runc]',
        '  runtime_type = "io.containerd.runc.v2"',
        # The handler of the `nvidia` RuntimeClass our operands ask for; the container toolkit
        # (an NVIDIA image, not run here) would point it at nvidia-container-runtime.
        f'{cri[:-1]}.containerd.runtimes.nvidia]',
        '  runtime_type = "io.containerd.runc.v2"',
        # as NVIDIA's toolkit configures it: the device plugin's CDI annotations reach the runtime
        '  container_annotations = ["cdi.k8s.io/*"]',
        *([f'{cri[:-1]}.containerd.runtimes.nvidia.options]', f'  BinaryName = "{nvidia_binary}"']
          if nvidia_binary else []),
        # registries' host configuration (certs.d/<host>/hosts.toml: their CA; see trust_registry)
        f"{cri[:-1]}.registry]",
        f'  config_path = "{base / "certs.d"}"',
        f"{cri[:-1]}.cni]",
        '  bin_dir = "/usr/lib/cni"',
        f'  conf_dir = "{base / "cni" / "net.d"}"',
        "",
    ])


def cni_conflist(base: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0", "name": "gpu-operator-sim",
        "plugins": [{
            "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
            "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(base / "cni" / "ipam")},
        }],
    }


@dataclass
class RealNode:
    """start() brings up the sandbox, apiserver proxy, containerd and kubelet and waits until
    the Node is Ready; stop() removes every container and process and the node's cgroups."""

    base_dir: Path
    name: str
    binaries: Binaries
    pki_dir: Path
    apiserver_port: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[str] = field(default_factory=list)
    # A fixture host tree: its run/nvidia is the node's /run/nvidia (validation status files, the
    # driver install dir); its driver (device nodes, nvidia-smi) is what the `nvidia` runtime
    # handler gives containers by the toolkit's rules; policies reach the rest through
    # hostPaths.rootFS (see `realspec.policy_spec`).
    host_root: Path | None = None
    # More host trees policies may point at (their run/ made a mount point like the first's).
    other_host_roots: tuple[Path, ...] = ()
    # The control plane's egress routes (sim/egress.py): registering the node's networks there lets
    # the apiserver reach its kubelet (kubectl logs, exec, port-forward) and its pods.
    egress_routes: Path | None = None
    sandbox: Sandbox = field(init=False)
    containerd: PrivateContainerd = field(init=False)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).absolute()
        (self.base_dir / "kubelet").mkdir(parents=True, exist_ok=True)
        binds: dict[str, Path] = {self.kubelet_root: self.base_dir / "kubelet",
                                  # the kubelet's device-plugin directory is fixed (not under --root-dir):
                                  # the node's own, so its sockets never land in this machine's /var/lib
                                  DEVICE_PLUGIN_DIR: self.base_dir / "device-plugins"}
        (self.base_dir / "device-plugins").mkdir(parents=True, exist_ok=True)
        roots = [Path(r).absolute() for r in ((self.host_root,) if self.host_root else ()) + self.other_host_roots]
        for root in roots:
            # A mount point, as /run is on a host: the validator's read-only /host (rootFS) then
            # still lets it write <rootFS>/run/nvidia/validations (a submount stays writable).
            (root / "run" / "nvidia" / "validations").mkdir(parents=True, exist_ok=True)
            binds[str(root / "run")] = root / "run"
        wrapper = None
        if self.host_root is not None:
            self.host_root = Path(self.host_root).absolute()
            binds["/run/nvidia"] = self.host_root / "run" / "nvidia"
            # the node's /var/run/cdi (/var/run is /run) is its tree's: the CDI specs a device
            # plugin's pod writes there are those the `nvidia` handler reads
            (self.host_root / "var" / "run" / "cdi").mkdir(parents=True, exist_ok=True)
            binds["/run/cdi"] = self.host_root / "var" / "run" / "cdi"
            wrapper = self.runtime_wrapper
            wrapper.write_text(nvruntime.wrapper_script(self.host_root))
            wrapper.chmod(0o755)
        self.sandbox = Sandbox(self.base_dir, binds=binds)
        self.containerd = PrivateContainerd(self.base_dir / "containerd", namespace=CRI_NAMESPACE, cri=True,
                                            extra_config=containerd_cri_config(self.base_dir, wrapper))

    @property
    def runtime_wrapper(self) -> Path:
        """The `nvidia` handler's binary (containerd's BinaryName), read at each container's creation."""
        return self.base_dir / "nvidia-runc"

    @property
    def kubelet_root(self) -> str:
        """The kubelet's --root-dir as the node sees it: base_dir/kubelet bound at a short path."""
        return f"{SHORT_ROOT}/kubelet"

    @property
    def cgroup_name(self) -> str:
        return cgroup_name(self.name, self.base_dir)

    @property
    def logs(self) -> Path:
        return self.base_dir / "logs"

    @property
    def pod_logs(self) -> Path:
        return self.base_dir / "pod-logs"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.processes[name] = proc
        return proc

    def pids(self) -> dict[str, tuple[int, Path]]:
        """What runs, with its log (for the simulator's state file): the sandbox holder first."""
        found = {"real-node-sandbox": (self.sandbox.holder, self.sandbox.log)}
        if self.containerd.process is not None:
            found["real-node-containerd"] = (self.containerd.process.pid, self.containerd.log)
        found.update({f"real-node-{k}": (p.pid, self.logs / f"{k}.log") for k, p in self.processes.items()})
        return found

    def start(self, timeout: float = 180.0, sandbox_started: bool = False) -> RealNode:
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            if not sandbox_started:
                self.sandbox.start()
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        base = self.base_dir
        self._spawn("nsproxy", proxy_argv(self.sandbox.netns_path, f"{SERVICE_IP}:443",
                                          f"127.0.0.1:{self.apiserver_port}"))
        pki = pki_mod.Pki(self.pki_dir)
        cert, key = pki_mod.issue_client_cert(pki, f"node-{self.name}", f"system:node:{self.name}",
                                              ["system:nodes"])
        serving = pki_mod.issue_serving_cert(pki, f"kubelet-{self.name}", self.name, [NODE_IP], [self.name])
        if self.egress_routes is not None:
            egress.register(self.egress_routes, self.name, self.sandbox.netns_path, [f"{NODE_IP}/32", POD_SUBNET])
        kubeconfig = write_kubeconfig(base / "kubelet.kubeconfig", server=f"https://{SERVICE_IP}:443",
                                      ca=pki.ca_cert, user=f"system:node:{self.name}",
                                      client_cert=cert, client_key=key)
        (base / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (base / "cni" / "net.d" / "10-gpu-operator-sim.conflist").write_text(
            json.dumps(cni_conflist(base), indent=2))
        self.containerd.launcher = self.sandbox.enter()
        self.containerd.start()
        archive = write_archive(base / "pause.oci.tar", PAUSE_IMAGE, {"/pause": self.binaries.pause},
                                ["/pause"])
        self.containerd.import_image(archive, base_name=PAUSE_IMAGE.rsplit(":", 1)[0])
        make_cgroups(self.cgroup_name)
        config = base / "kubelet-config.yaml"
        cfg = kubelet_config(base, pki.ca_cert, self.containerd.endpoint, serving)
        cfg["cgroupRoot"] = f"/{CGROUP_PARENT}/{self.cgroup_name}"
        config.write_text(yaml.safe_dump(cfg))
        argv = [*self.sandbox.enter(), str(self.binaries.kube), "kubelet",
                f"--config={config}", f"--kubeconfig={kubeconfig}", f"--root-dir={self.kubelet_root}",
                f"--hostname-override={self.name}", f"--node-ip={NODE_IP}", "--v=2"]
        if self.taints:
            argv.append("--register-with-taints=" + ",".join(self.taints))
        self._spawn("kubelet", argv)
        self.wait_ready(timeout)
        if self.labels:
            # As an admin, after registration: the kubelet refuses NFD's *.kubernetes.io labels.
            self.admin("PATCH", f"/api/v1/nodes/{self.name}", {"metadata": {"labels": self.labels}},
                        "application/merge-patch+json")

    def trust_registry(self, host: str, ca_cert: Path) -> None:
        """Pull from the registry at `host` (127.0.0.1:PORT on this machine): containerd's host
        configuration for it with the CA, and a forwarder from the same address inside the node."""
        from gpu_operator.sim.containerd import hosts_toml

        hosts = self.base_dir / "certs.d" / host
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "ca.crt").write_bytes(Path(ca_cert).read_bytes())
        (hosts / "hosts.toml").write_text(hosts_toml(host, hosts / "ca.crt"))
        self._spawn(f"registry-proxy-{host.rsplit(':', 1)[1]}", proxy_argv(self.sandbox.netns_path, host, host))

    def wait_allocatable(self, resource: str, value: str, timeout: float) -> None:
        """Until the kubelet reports `resource` allocatable as `value` (a registered device plugin,
        which runs only in a device-plugin pod: see `pluginimage`)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.admin("GET", f"/api/v1/nodes/{self.name}").get("status", {})
            if status.get("allocatable", {}).get(resource) == value:
                return
            if time.monotonic() > deadline:
                raise RealNodeError(f"real node {self.name}: {resource} allocatable is "
                                    f"{status.get('allocatable', {}).get(resource)!r}, not {value}, after {timeout:.0f}s; "
                                    f"see the device plugin pod's log (pod logs under {self.pod_logs})")
            time.sleep(0.5)

    def import_images(self, archive: Path) -> list[str]:
        """Our image (docker-archive `archive`) and the stand-ins' images built on it (the CUDA
        sample, the device plugin under NVIDIA's name: `pluginimage`) into the node's containerd;
        returns the image names added."""
        sample = cudasample.build(archive, self.base_dir / "cuda-sample.docker.tar")
        plugin = pluginimage.build(archive, self.base_dir / "device-plugin.docker.tar")
        return [*self.containerd.import_image(archive), *self.containerd.import_image(sample),
                *self.containerd.import_image(plugin)]

    def admin(self, method: str, path: str, body: Any = None,
               content_type: str = "application/json") -> Any:
        import ssl
        import urllib.request

        pki = pki_mod.Pki(self.pki_dir)
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(pki.client_cert("admin"), pki.client_key("admin"))
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"https://127.0.0.1:{self.apiserver_port}{path}", data=data,
                                     method=method, headers={"Content-Type": content_type})
        with urllib.request.urlopen(req, context=context, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RealNodeError(f"real node {self.name}: {name} exited with code {proc.returncode}; "
                                        f"log {self.logs / (name + '.log')}:\n{_tail(self.logs / (name + '.log'))}")
            with contextlib.suppress(OSError, ValueError):
                node = self.admin("GET", f"/api/v1/nodes/{self.name}")
                conds = node.get("status", {}).get("conditions", [])
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                    return
            if time.monotonic() > deadline:
                log = self.logs / "kubelet.log"
                raise RealNodeError(f"real node {self.name} not Ready after {timeout:.0f}s; kubelet log {log}:\n"
                                    f"{_tail(log, 40)}")
            time.sleep(0.5)

    def http_get(self, url: str, timeout: float = 10.0) -> str:
        """GET `url` from inside the node's network (pod IPs live there); raises with the output."""
        script = ("import sys, urllib.request\n"
                  "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())")
        done = self.sandbox.run([sys.executable, "-c", script, url, str(timeout)], timeout=timeout + 20)
        if done.returncode != 0:
            raise RealNodeError(f"GET {url} inside real node {self.name} failed: {done.stderr.strip()[-500:]}")
        return done.stdout

    def stop(self) -> None:
        kubelet = self.processes.pop("kubelet", None)
        if kubelet is not None:
            terminate(kubelet)
        with contextlib.suppress(Exception):
            self.containerd.stop()
        for proc in self.processes.values():
            terminate(proc)
        self.processes.clear()
        self.sandbox.stop()
        remove_cgroups(self.cgroup_name)
        if self.egress_routes is not None:
            (self.egress_routes / f"{self.name}.json").unlink(missing_ok=True)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def cleanup(base_dir: Path, name: str, holder: int) -> None:
    """After `sim down` stopped the recorded processes: kill what is left in the sandbox (shims,
    containers) and remove the node's cgroups. Safe to repeat."""
    if holder:
        Sandbox(base_dir, holder=holder).stop(grace=2.0)
    remove_cgroups(cgroup_name(name, base_dir))


IMAGE_ENV = "GPU_OPERATOR_IMAGE_ARCHIVE"


def _newest_source(repo: Path) -> float:
    """The newest modification time among what goes into our image."""
    files = [repo / "pyproject.toml", *(repo / "tools" / "image").iterdir(),
             *(repo / "src").rglob("*")]
    return max((f.stat().st_mtime for f in files if f.is_file() and "__pycache__" not in f.parts), default=0.0)


def image_archive(build: bool = True) -> Path:
    """Our image as a docker-archive for the real node: $GPU_OPERATOR_IMAGE_ARCHIVE, else the
    checkout's dist/gpu-operator-<version>.docker.tar, built by tools/image/build.sh if missing or
    older than the sources it is built from (the real node must run the code under test)."""
    from gpu_operator import __version__
    from gpu_operator.sim.binaries import build_script

    if os.environ.get(IMAGE_ENV):
        return Path(os.environ[IMAGE_ENV])
    script = build_script()
    if script is None:
        raise RealNodeError(f"our image is needed on the real node: set ${IMAGE_ENV} to an archive "
                            "made by `./dev image`")
    repo = script.parents[2]
    archive = repo / "dist" / f"gpu-operator-{__version__}.docker.tar"
    if build and (not archive.exists() or _newest_source(repo) > archive.stat().st_mtime):
        done = subprocess.run([str(repo / "tools" / "image" / "build.sh")], cwd=repo, check=False,
                              env={**os.environ, "PYTHON": str(repo / ".venv" / "bin" / "python")})
        if done.returncode != 0:
            raise RealNodeError("building our image for the real node failed (tools/image/build.sh); "
                                "see the messages above, or set $" + IMAGE_ENV)
    if not archive.exists():
        raise RealNodeError(f"{archive} is missing: run `./dev image` or set ${IMAGE_ENV}")
    return archive
