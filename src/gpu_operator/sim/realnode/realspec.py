"""What the real node is given by its shape (labels, a host tree) and the
ClusterPolicy settings that point our operands at that host tree instead of this machine's /.

Only our image runs on the real node: the operands of NVIDIA images (driver, toolkit, GFD, DCGM,
MIG manager, ...) cannot be pulled here, so their deploy labels are `false` on it and they run on
kwok nodes only. The device plugin is the exception: the simulator imports its stand-in's image
under NVIDIA's name (`pluginimage`), so the operator's DaemonSet runs it there, and the node's
`nvidia.com/gpu` is registered only while that pod runs. What the others would have left on a GPU
host is given instead: the host tree's driver (a fixture with its device nodes) and the `nvidia`
runtime handler giving containers what the container toolkit would (see `nvruntime`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_operator.shapes import DRIVER_VERSION
from gpu_operator.sim.realnode.cudasample import CUDA_SAMPLE_IMAGE

# The operands whose image is ours (the validator, the node-status exporter, the vfio manager
# and GPU probe): the only ones the real node runs. Every other operand pulls an NVIDIA image, which cannot be pulled here.
OWN_IMAGE_OPERANDS = (
    "operator-validator",
    "node-status-exporter",
    "vfio-manager",
)  # (and the GPU probe, gated by the same label)
# Operands of an NVIDIA image whose stand-in's image the real node has under NVIDIA's name.
STAND_IN_IMAGE_OPERANDS = ("device-plugin",)
# The validator and the exporter run the host tree's nvidia-smi directly: a fixture tree has no
# shell or libc to chroot into (the node-agent tests run them the same way).
NO_CHROOT = {"name": "GPU_OPERATOR_NO_CHROOT", "value": "1"}


def node_labels(shape: str) -> dict[str, str]:
    """The labels a real node of `shape` carries when it joins: the shape's kubelet and NFD labels
    (what our probe and GFD would add comes later, from the probe pod), and
    `nvidia.com/gpu.deploy.<operand>=false` for every operand of an NVIDIA image the node cannot
    run (the operator's node labelling keeps an existing value, so those DaemonSets never select
    this node)."""
    from gpu_operator import shapes
    from gpu_operator.vocabulary import ALL_DEPLOY_LABELS, deploy_label

    manifest = shapes.nodes([shape])[0]
    labels = {
        k: v
        for k, v in manifest["metadata"].get("labels", {}).items()
        if not k.startswith("kubernetes.io/") and k != "type"
    }
    own = {deploy_label(c) for c in OWN_IMAGE_OPERANDS + STAND_IN_IMAGE_OPERANDS}
    labels.update({key: "false" for key in ALL_DEPLOY_LABELS - own})
    return labels


def policy_spec(host_root: Path | str, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ClusterPolicy spec (`base`, default: every default) whose operands reach the real node's
    host tree: `hostPaths.rootFS` is the tree (the validator's driver check and the exporter read
    its sysfs/proc and run its nvidia-smi); the CUDA check's workload pod runs the CUDA sample
    stand-in (`cudasample`; NVIDIA's image cannot be pulled here); the node-status exporter is on,
    so its metrics can be scraped from its pod."""
    spec: dict[str, Any] = {**(base or {})}
    spec["hostPaths"] = {**spec.get("hostPaths", {}), "rootFS": str(host_root)}
    spec["nodeStatusExporter"] = {"enabled": True, **spec.get("nodeStatusExporter", {}), "env": [NO_CHROOT]}
    validator = dict(spec.get("validator", {}))
    validator["driver"] = {"env": [NO_CHROOT]}
    validator["cuda"] = {"env": [{"name": "CUDA_VALIDATOR_IMAGE", "value": CUDA_SAMPLE_IMAGE}]}
    spec["validator"] = validator
    return spec


HOST_DRIVER_VERSION = DRIVER_VERSION  # the version every simulated GPU node runs (shapes)
_NVIDIA_SMI = f"""#!/bin/sh
# The host tree's nvidia-smi: answers as a driver {HOST_DRIVER_VERSION} would (there is no GPU here).
if [ "$1" = "--version" ]; then echo "NVIDIA-SMI version  : {HOST_DRIVER_VERSION}"; exit 0; fi
echo "NVIDIA-SMI {HOST_DRIVER_VERSION}    Driver Version: {HOST_DRIVER_VERSION}    CUDA Version: 12.4"
"""

_CONTAINERD_CONFIG = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
"""
_NVIDIA_RUNTIME = """[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"""

_CONTAINERD3_CONFIG = """version = 3
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
"""
# The container runtime's files on a host of each distribution (where node/host/runtime.py's probe looks:
# docs/operands.md, "Runtimes by distribution"): its config (as the distribution writes it) and socket.
_RANCHER = "/var/lib/rancher/{}/agent/etc/containerd/config.toml"
RUNTIME_FILES: dict[str, dict[str, str]] = {
    "containerd": {"/etc/containerd/config.toml": _CONTAINERD_CONFIG, "/run/containerd/containerd.sock": ""},
    "k3s": {_RANCHER.format("k3s"): _CONTAINERD_CONFIG, "/run/k3s/containerd/containerd.sock": ""},
    "rke2": {_RANCHER.format("rke2"): _CONTAINERD3_CONFIG, "/run/k3s/containerd/containerd.sock": ""},
    "microk8s": {
        "/var/snap/microk8s/current/args/containerd-template.toml": _CONTAINERD_CONFIG,
        "/var/snap/microk8s/current/args/containerd.toml": _CONTAINERD_CONFIG,
        "/var/snap/microk8s/common/run/containerd.sock": "",
    },
    "k0s": {
        "/etc/k0s/containerd.toml": "# k0s_managed=true\n" + _CONTAINERD_CONFIG,
        "/run/k0s/containerd.sock": "",
    },
    "crio": {"/etc/crio/crio.conf": "[crio.runtime]\n", "/var/run/crio/crio.sock": ""},
}


def host_spec(shape: str) -> dict[str, Any]:
    """The host tree of a real node of `shape` (see `hosttree`): its GPUs on the PCI bus, and
    what its labels say about the driver: installed on the host (nvidia bound, nvidia-smi
    present), GPUs bound to vfio-pci (vm-passthrough), or none yet (the operator's driver, an
    NVIDIA image, would install it: the validator then waits for it)."""
    from gpu_operator import shapes
    from gpu_operator.vocabulary import NFD_HYPERVISOR, WORKLOAD_CONFIG

    found, _ = shapes.parse_spec(shape)
    labels = found.labels(shape)
    if labels.get(NFD_HYPERVISOR) == "true":  # a VM guest: its GPUs as KubeVirt passes them in
        from gpu_operator.sim.hardware import guesttree

        model = {v[0]: k for k, v in guesttree.MODELS.items()}.get(found.gpu_vendor_device.partition(":")[2])
        if model is None:
            raise ValueError(
                f"shape {shape}: no guest tree for GPU {found.gpu_vendor_device} "
                f"(sim/hardware/guesttree.py knows {', '.join(guesttree.MODELS)})"
            )
        return guesttree.guest_spec(found.gpu_count, model, driver=found.host_driver)
    vendor, _, device = found.gpu_vendor_device.partition(":")
    host_driver = found.host_driver
    passthrough = found.gpu_driver == "vfio-pci" or labels.get(WORKLOAD_CONFIG) == "vm-passthrough"
    driver = "nvidia" if host_driver else "vfio-pci" if passthrough else None
    spec: dict[str, Any] = {
        "os": {"id": found.os_id, "version_id": found.os_version_id},
        "kernel": found.kernel,
        "devices": [
            {
                "address": f"0000:{0x41 + i:02x}:00.0",
                "vendor": vendor,
                "device": device,
                "class": "030200",
                "driver": driver,
            }
            for i in range(found.gpu_count)
        ],
        "modules": [],
        "pci_drivers": [driver] if driver else [],
        # The node's runtime as the probe finds it on a host: its distribution's (stock containerd:
        # CRI, runc by default).
        "files": dict(RUNTIME_FILES.get(distribution(found), RUNTIME_FILES["containerd"])),
    }
    if host_driver:
        spec["modules"] = ["nvidia", "nvidia_uvm", "nvidia_modeset"]
        spec["driver_version"] = HOST_DRIVER_VERSION
        spec["executables"] = {"/usr/bin/nvidia-smi": _NVIDIA_SMI}
        # the driver's libraries the toolkit mounts for `utility` and `compute` (empty placeholders:
        # nothing here loads them; the CUDA sample stand-in checks libcuda was given)
        spec["files"].update(
            {
                f"/usr/lib/x86_64-linux-gnu/{lib}.{HOST_DRIVER_VERSION}": ""
                for lib in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so")
            }
        )
        # and the nvidia runtime, as the distribution's toolkit package configures it
        if "/etc/containerd/config.toml" in spec["files"]:
            spec["files"]["/etc/containerd/config.toml"] += _NVIDIA_RUNTIME
    elif passthrough:
        spec["modules"] = ["vfio_pci", "vfio", "vfio_iommu_type1"]
    if host_driver and labels.get(WORKLOAD_CONFIG) == "vm-vgpu":  # the vGPU manager on the host
        from gpu_operator.sim.hardware.vgpuhw import as_vgpu_host

        return as_vgpu_host(spec)
    return spec


def distribution(shape: Any) -> str:
    """The distribution whose runtime a host of `shape` runs (render/distributions.py's rule over
    what its Node says)."""
    from gpu_operator.render.distributions import detect

    return detect(shape.runtime, shape.kubelet, {}, shape.labels(shape.name))
