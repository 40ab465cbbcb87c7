"""A real node for the simulator: the kubelet (from the control plane's multicall binary) and
Debian's containerd + runc, registered with the simulator's apiserver, running real pods.

Everything lives under ``base_dir`` (containerd root/state/socket, the kubelet's root dir, its
certificates, pod logs, CNI state) or inside the node's namespace sandbox (see `nodens`); the
kubelet's cgroups are created under ``/<hierarchy>/gpu-operator-sim/<node>`` and removed on stop.

`RealNode` starts and stops its processes; what they are configured with is in `nodeconfig`, its
cgroups in `nodecgroups`, our image for it in `nodeimage`, and the client side (admin requests,
waiting for Ready) in `nodeclient.NodeClient`, its base.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpu_operator.sim.plane import egress
from gpu_operator.sim.plane import pki as pki_mod
from gpu_operator.sim.plane.binaries import Binaries
from gpu_operator.sim.plane.kubeconfig import write_kubeconfig
from gpu_operator.sim.plane.processes import RealNodeError, terminate
from gpu_operator.sim.realnode import cudasample, nvruntime, pluginimage
from gpu_operator.sim.realnode.containerd import PrivateContainerd
from gpu_operator.sim.realnode.nodecgroups import (
    CGROUP_PARENT,
    cgroup_dirs,
    cgroup_name,
    cgroup_pids,
    cleanup,
    make_cgroups,
    remove_cgroups,
)
from gpu_operator.sim.realnode.nodeclient import NodeClient
from gpu_operator.sim.realnode.nodeconfig import (
    CRI_NAMESPACE,
    DEVICE_PLUGIN_DIR,
    PAUSE_IMAGE,
    cni_conflist,
    containerd_cri_config,
    kubelet_config,
    sandbox_binds,
)
from gpu_operator.sim.realnode.nodeimage import image_archive
from gpu_operator.sim.realnode.nodens import NODE_IP, POD_SUBNET, SERVICE_IP, SHORT_ROOT, Sandbox, proxy_argv
from gpu_operator.sim.realnode.ociarchive import write_archive

# What callers import from here besides RealNode (the simulator's session, test fixtures).
__all__ = [
    "DEVICE_PLUGIN_DIR",
    "RealNode",
    "RealNodeError",
    "cgroup_dirs",
    "cgroup_name",
    "cgroup_pids",
    "cleanup",
    "image_archive",
    "terminate",
]


@dataclass
class RealNode(NodeClient):
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
    # The control plane's egress routes (sim/plane/egress.py): registering the node's networks there lets
    # the apiserver reach its kubelet (kubectl logs, exec, port-forward) and its pods.
    egress_routes: Path | None = None
    sandbox: Sandbox = field(init=False)
    containerd: PrivateContainerd = field(init=False)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).absolute()
        if self.host_root is not None:
            self.host_root = Path(self.host_root).absolute()
        binds = sandbox_binds(self.base_dir, self.kubelet_root, self.host_root, self.other_host_roots)
        wrapper = None
        if self.host_root is not None:
            wrapper = self.runtime_wrapper
            wrapper.write_text(nvruntime.wrapper_script(self.host_root))
            wrapper.chmod(0o755)
        self.sandbox = Sandbox(self.base_dir, binds=binds)
        self.containerd = PrivateContainerd(
            self.base_dir / "containerd",
            namespace=CRI_NAMESPACE,
            cri=True,
            extra_config=containerd_cri_config(self.base_dir, wrapper),
        )

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

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
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
        self._spawn(
            "nsproxy",
            proxy_argv(self.sandbox.netns_path, f"{SERVICE_IP}:443", f"127.0.0.1:{self.apiserver_port}"),
        )
        pki = pki_mod.Pki(self.pki_dir)
        cert, key = pki_mod.issue_client_cert(
            pki, f"node-{self.name}", f"system:node:{self.name}", ["system:nodes"]
        )
        serving = pki_mod.issue_serving_cert(pki, f"kubelet-{self.name}", self.name, [NODE_IP], [self.name])
        if self.egress_routes is not None:
            egress.register(
                self.egress_routes, self.name, self.sandbox.netns_path, [f"{NODE_IP}/32", POD_SUBNET]
            )
        kubeconfig = write_kubeconfig(
            base / "kubelet.kubeconfig",
            server=f"https://{SERVICE_IP}:443",
            ca=pki.ca_cert,
            user=f"system:node:{self.name}",
            client_cert=cert,
            client_key=key,
        )
        (base / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (base / "cni" / "net.d" / "10-gpu-operator-sim.conflist").write_text(
            json.dumps(cni_conflist(base), indent=2)
        )
        self.containerd.launcher = self.sandbox.enter()
        self.containerd.start()
        archive = write_archive(
            base / "pause.oci.tar", PAUSE_IMAGE, {"/pause": self.binaries.pause}, ["/pause"]
        )
        self.containerd.import_image(archive, base_name=PAUSE_IMAGE.rsplit(":", 1)[0])
        make_cgroups(self.cgroup_name)
        config = base / "kubelet-config.yaml"
        cfg = kubelet_config(base, pki.ca_cert, self.containerd.endpoint, serving)
        cfg["cgroupRoot"] = f"/{CGROUP_PARENT}/{self.cgroup_name}"
        config.write_text(yaml.safe_dump(cfg))
        argv = [
            *self.sandbox.enter(),
            str(self.binaries.kube),
            "kubelet",
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.kubelet_root}",
            f"--hostname-override={self.name}",
            f"--node-ip={NODE_IP}",
            "--v=2",
        ]
        if self.taints:
            argv.append("--register-with-taints=" + ",".join(self.taints))
        self._spawn("kubelet", argv)
        self.wait_ready(timeout)
        if self.labels:
            # As an admin, after registration: the kubelet refuses NFD's *.kubernetes.io labels.
            self.admin(
                "PATCH",
                f"/api/v1/nodes/{self.name}",
                {"metadata": {"labels": self.labels}},
                "application/merge-patch+json",
            )

    def trust_registry(self, host: str, ca_cert: Path) -> None:
        """Pull from the registry at `host` (127.0.0.1:PORT on this machine): containerd's host
        configuration for it with the CA, and a forwarder from the same address inside the node."""
        from gpu_operator.sim.realnode.containerd import hosts_toml

        hosts = self.base_dir / "certs.d" / host
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "ca.crt").write_bytes(Path(ca_cert).read_bytes())
        (hosts / "hosts.toml").write_text(hosts_toml(host, hosts / "ca.crt"))
        self._spawn(
            f"registry-proxy-{host.rsplit(':', 1)[1]}", proxy_argv(self.sandbox.netns_path, host, host)
        )

    def import_images(self, archive: Path) -> list[str]:
        """Our image (docker-archive `archive`) and the stand-ins' images built on it (the CUDA
        sample, the device plugin under NVIDIA's name: `pluginimage`) into the node's containerd;
        returns the image names added."""
        sample = cudasample.build(archive, self.base_dir / "cuda-sample.docker.tar")
        plugin = pluginimage.build(archive, self.base_dir / "device-plugin.docker.tar")
        return [
            *self.containerd.import_image(archive),
            *self.containerd.import_image(sample),
            *self.containerd.import_image(plugin),
        ]

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
