"""The CDI spec NVIDIA's GPU kubelet plugin writes for a claim, played over a host tree from the
plugin container as the operator renders it (test support: what the DRA stack's driver root must
get right, checked without a kubelet).

From NVIDIA/k8s-dra-driver-gpu (facts only):
- cmd/gpu-kubelet-plugin/main.go: the host driver root is NVIDIA_DRIVER_ROOT (default `/`), the
  container's view of it DRIVER_ROOT_CTR_PATH (default `/driver-root`), CDI specs go to CDI_ROOT;
- the operator's container sources the validator's driver-ready file first (`set -a; .
  .../driver-ready`), so the file's keys win over the container's env;
- device_state.go / root.go: driver files are looked up under the container's root, the dev root
  is that root when it has a /dev directory, else `/`;
- cdi.go: one transient spec per claim, vendor `k8s.gpu.nvidia.com`, class `claim`, devices named
  `<claim uid>-gpu-<index>`, file `<vendor>-<class>_<uid>.yaml` in CDI_ROOT; before it is written
  every host path under the container's root is moved to the host root (`transformroot` with
  root = DRIVER_ROOT_CTR_PATH, target = NVIDIA_DRIVER_ROOT); a mount's container path is the
  file's path under the driver root.
What it writes here: the GPU's /dev/nvidia<minor> and the driver's /dev/nvidiactl, /dev/nvidia-uvm
and /dev/nvidia-uvm-tools where the dev root has them; nvidia-smi (and the other utilities found
beside it) and every library of the driver's version in libnvidia-ml's directory as mounts. Not
played: the hooks (ldcache, symlinks), MIG and vfio devices, firmware and IPC sockets.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.node.host.driver import driver_files, under_root
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.realnode import toolkit
from gpu_operator.vocabulary import VALIDATIONS_DIR

VENDOR, CLASS = "k8s.gpu.nvidia.com", "claim"
UTILITIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
DRIVER_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class PluginError(Exception):
    """The plugin cannot build the claim's spec (it fails its start, or the claim's preparation)."""


def _strip(root: str, path: str) -> str:
    return "/" + path.removeprefix(root.rstrip("/")).lstrip("/")


def plugin_env(container: dict[str, Any], host_root: Path) -> dict[str, str]:
    """The plugin's environment: the container's values, then the driver-ready file it sources."""
    env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    ready = host_root / VALIDATIONS_DIR.lstrip("/") / "driver-ready"
    if not ready.is_file():
        raise PluginError(
            f"{VALIDATIONS_DIR}/driver-ready is missing: the container's start script cannot source it"
        )
    for line in ready.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            env[key.strip()] = " ".join(shlex.split(value))
    return env


def mounts_of(container: dict[str, Any], volumes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(container path, host path) of the container's hostPath mounts, longest container path first."""
    host = {v["name"]: v["hostPath"]["path"] for v in volumes if "hostPath" in v}
    found = [
        (m["mountPath"].rstrip("/") or "/", host[m["name"]])
        for m in container.get("volumeMounts", [])
        if m["name"] in host
    ]
    return sorted(found, key=lambda pair: len(pair[0]), reverse=True)


def on_host(path: str, mounts: list[tuple[str, str]]) -> str | None:
    """The host path a container path is, through its mounts (None: not a host mount)."""
    for ctr_path, host_path in mounts:
        if path == ctr_path or path.startswith(ctr_path.rstrip("/") + "/"):
            return under_root(host_path, _strip(ctr_path, path))
    return None


def claim_spec(
    host_root: Path,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
    claim_uid: str,
    gpu_indices: list[int],
) -> tuple[dict[str, Any], Path, list[str]]:
    """The claim's spec, the file it is written to in the tree and the qualified device names."""
    env = plugin_env(container, host_root)
    target = env.get("NVIDIA_DRIVER_ROOT", "/")
    ctr_root = env.get("DRIVER_ROOT_CTR_PATH", "/driver-root")
    mounts = mounts_of(container, volumes)
    seen_root = on_host(ctr_root, mounts)
    if seen_root is None:
        raise PluginError(
            f"DRIVER_ROOT_CTR_PATH {ctr_root} is not a host mount of container {container['name']}"
        )
    fs = HostFS(host_root)
    smi, nvml = driver_files(fs, seen_root)
    if smi is None or nvml is None:
        missing = [name for name, path in (("nvidia-smi", smi), ("libnvidia-ml.so", nvml)) if path is None]
        raise PluginError(f"{ctr_root} ({seen_root} on host): {', '.join(missing)} not found")

    def host_path(found: str) -> str:  # transformroot: the container's root becomes NVIDIA_DRIVER_ROOT
        return under_root(target, _strip(seen_root, found))

    mounts_out: list[dict[str, Any]] = []
    for name in UTILITIES:
        binary = f"{smi.rsplit('/', 1)[0]}/{name}"
        if fs.exists(binary):
            mounts_out.append(
                {
                    "hostPath": host_path(binary),
                    "containerPath": _strip(seen_root, binary),
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            )
    lib_dir, _, nvml_name = nvml.rpartition("/")
    version = nvml_name.removeprefix("libnvidia-ml.so.")
    for lib in sorted(e for e in fs.listdir(lib_dir) if e.endswith(f".so.{version}")):
        path = f"{lib_dir}/{lib}"
        mounts_out.append(
            {
                "hostPath": host_path(path),
                "containerPath": _strip(seen_root, path),
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        )
    dev_root = seen_root if fs.is_dir(under_root(seen_root, "/dev")) else "/"
    common_nodes = [
        {"path": d, "hostPath": under_root(dev_root, d)}
        for d in DRIVER_DEVICES
        if fs.exists(under_root(dev_root, d))
    ]
    by_index = {g.index: g for g in toolkit.gpus(host_root)}
    devices = []
    for index in gpu_indices:
        if index not in by_index:
            raise PluginError(f"GPU {index} is not on this node (the driver lists {sorted(by_index)})")
        node = f"/dev/nvidia{by_index[index].minor}"
        devices.append(
            {
                "name": f"{claim_uid}-gpu-{index}",
                "containerEdits": {"deviceNodes": [{"path": node, "hostPath": under_root(dev_root, node)}]},
            }
        )
    spec = {
        "cdiVersion": "0.5.0",
        "kind": f"{VENDOR}/{CLASS}",
        "devices": devices,
        "containerEdits": {"deviceNodes": common_nodes, "mounts": mounts_out},
    }
    cdi_root = on_host(env.get("CDI_ROOT", "/var/run/cdi"), mounts)
    if cdi_root is None:
        raise PluginError(
            f"CDI_ROOT {env.get('CDI_ROOT')} is not a host mount of container {container['name']}"
        )
    written = host_root / cdi_root.lstrip("/") / f"{VENDOR}-{CLASS}_{claim_uid}.yaml"
    written.parent.mkdir(parents=True, exist_ok=True)
    written.write_text(yaml.safe_dump(spec, sort_keys=False))
    return spec, written, [f"{VENDOR}/{CLASS}={d['name']}" for d in devices]


def host_paths(spec: dict[str, Any]) -> list[str]:
    """Every host path the spec names (device nodes and mount sources)."""
    edits = [spec.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in spec["devices"])]
    out: list[str] = []
    for edit in edits:
        out += [str(n.get("hostPath") or n["path"]) for n in edit.get("deviceNodes") or []]
        out += [str(m["hostPath"]) for m in edit.get("mounts") or []]
    return out
