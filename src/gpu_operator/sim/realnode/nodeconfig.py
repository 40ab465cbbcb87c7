"""What a real node's daemons are configured with: the kubelet's configuration, containerd's CRI
settings (the pause image, the `nvidia` handler, registries' host configuration), the CNI
network, and the node sandbox's bind mounts (the kubelet's directories, the host trees a node is
given and their run/ directories)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_operator.sim.realnode.nodens import NODE_IP, POD_SUBNET

PAUSE_IMAGE = "localhost/gpu-operator-sim/pause:1"
CRI_NAMESPACE = "k8s.io"
# The kubelet's device-plugin directory (fixed in the kubelet, not under --root-dir).
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


def kubelet_config(base: Path, ca: Path, endpoint: str, serving: tuple[Path, Path]) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 hosts: 1.35+ refuses them unless told (the default is true).
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "containerRuntimeEndpoint": endpoint,
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        # Its API, reached by the apiserver through the egress proxy: a serving certificate from
        # the simulator's CA (the apiserver verifies it), clients with a certificate of that CA
        # only (the apiserver's kubelet client), no anonymous access.
        "tlsCertFile": str(serving[0]),
        "tlsPrivateKeyFile": str(serving[1]),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(base / "pod-logs"),
        "failSwapOn": False,
        "protectKernelDefaults": False,
        "resolvConf": "",
        "clusterDomain": "cluster.local",
        "maxPods": 40,
        "serializeImagePulls": False,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        # Every image here is imported (no registry is reachable): one already on the node is used
        # as it is. With the kubelet's default (NeverVerifyPreloadedImages, KubeletEnsureSecretPulledImages
        # on since 1.35) an image it once tried to pull counts as pulled by it and is pulled again
        # for every pod: a name imported or tagged after a failed attempt was never used (the
        # take-over test's NVIDIA validator image, ImagePullBackOff for good).
        "imagePullCredentialsVerificationPolicy": "NeverVerify",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "60s",
        "httpCheckFrequency": "60s",
        "shutdownGracePeriod": "0s",
        "logging": {"format": "text"},
    }


def containerd_cri_config(base: Path, nvidia_binary: Path | None = None) -> str:
    """CRI settings; the `nvidia` handler runs `nvidia_binary` (see `nvruntime`) instead of runc
    when given, plain runc otherwise."""
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return "\n".join(
        [
            cri,
            f'  sandbox_image = "{PAUSE_IMAGE}"',
            "  enable_selinux = false",
            # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which root lacks on these machines (runc:
            # "failed to update /proc/self/oom_score_adj: Permission denied"): clamp to our own.
            "  restrict_oom_score_adj = true",
            f"{cri[:-1]}.containerd]",
            '  default_runtime_name = "runc"',
            f"{cri[:-1]}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            # The handler of the `nvidia` RuntimeClass our operands ask for; the container toolkit
            # (an NVIDIA image, not run here) would point it at nvidia-container-runtime.
            f"{cri[:-1]}.containerd.runtimes.nvidia]",
            '  runtime_type = "io.containerd.runc.v2"',
            # as NVIDIA's toolkit configures it: the device plugin's CDI annotations reach the runtime
            '  container_annotations = ["cdi.k8s.io/*"]',
            *(
                [f"{cri[:-1]}.containerd.runtimes.nvidia.options]", f'  BinaryName = "{nvidia_binary}"']
                if nvidia_binary
                else []
            ),
            # registries' host configuration (certs.d/<host>/hosts.toml: their CA; see trust_registry)
            f"{cri[:-1]}.registry]",
            f'  config_path = "{base / "certs.d"}"',
            f"{cri[:-1]}.cni]",
            '  bin_dir = "/usr/lib/cni"',
            f'  conf_dir = "{base / "cni" / "net.d"}"',
            "",
        ]
    )


def cni_conflist(base: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "gpu-operator-sim",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(base / "cni" / "ipam"),
                },
            }
        ],
    }


def sandbox_binds(
    base: Path, kubelet_root: str, host_root: Path | None, other_host_roots: tuple[Path, ...]
) -> dict[str, Path]:
    """The node sandbox's bind mounts (node path -> directory here), making the directories:
    the kubelet's root and device-plugin directories under `base`, each host tree's run/, and
    with `host_root` the node's /run/nvidia and /run/cdi from it (absolute paths)."""
    (base / "kubelet").mkdir(parents=True, exist_ok=True)
    binds: dict[str, Path] = {
        kubelet_root: base / "kubelet",
        # the kubelet's device-plugin directory is fixed (not under --root-dir):
        # the node's own, so its sockets never land in this machine's /var/lib
        DEVICE_PLUGIN_DIR: base / "device-plugins",
    }
    (base / "device-plugins").mkdir(parents=True, exist_ok=True)
    roots = [Path(r).absolute() for r in ((host_root,) if host_root else ()) + other_host_roots]
    for root in roots:
        # A mount point, as /run is on a host: the validator's read-only /host (rootFS) then
        # still lets it write <rootFS>/run/nvidia/validations (a submount stays writable).
        (root / "run" / "nvidia" / "validations").mkdir(parents=True, exist_ok=True)
        binds[str(root / "run")] = root / "run"
    if host_root is not None:
        binds["/run/nvidia"] = host_root / "run" / "nvidia"
        # the node's /var/run/cdi (/var/run is /run) is its tree's: the CDI specs a device
        # plugin's pod writes there are those the `nvidia` handler reads
        (host_root / "var" / "run" / "cdi").mkdir(parents=True, exist_ok=True)
        binds["/run/cdi"] = host_root / "var" / "run" / "cdi"
    return binds
