"""The device plugin's image on the real node: NVIDIA's (the ClusterPolicy's default
`DEVICE_PLUGIN_IMAGE`, nvcr.io/nvidia/k8s-device-plugin) cannot be pulled here, so the simulator
imports an image under that name into the node's containerd, built without a registry from ours:
one more layer with the gRPC and protobuf libraries the stand-in speaks the kubelet's device-plugin
API with (those of the Python the simulator runs in, and the C++ runtime gRPC links, libstdc++, as
loaded here; our image needs none of them) and the
executable the operator's DaemonSet runs, `nvidia-device-plugin` (its entrypoint script ends in
`exec nvidia-device-plugin`), which starts the device-plugin stand-in (`deviceplugin`) inside the
pod with the pod's mounts: the host tree at /host (hostPaths.rootFS), the kubelet's socket
directory at /var/lib/kubelet/device-plugins, CDI specs at /var/run/cdi, the plugin config at
CONFIG_FILE, its strategies from DEVICE_LIST_STRATEGY and MIG_STRATEGY. It runs as root, as
NVIDIA's image does (the socket directory is root's).

So the stand-in lives and dies with the pod: no pod on the node, no plugin socket, nothing
allocatable. Not played: NVIDIA's config-manager (the containers a policy with
devicePlugin.config gets; the image has no `config-manager`, so such a pod does not start).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.sim.realnode import ociarchive

DEVICE_PLUGIN_IMAGE = CHART_DEFAULT_IMAGES["DEVICE_PLUGIN_IMAGE"]  # never pulled: imported
EXECUTABLE = "/usr/local/bin/nvidia-device-plugin"
SITE = "/usr/local/lib/python3.11/dist-packages"  # where our image's packages are installed
PYTHON = (3, 11)  # our image's Python (Debian bookworm): the libraries' compiled parts must match
# The stand-in as the pod runs it: the pod's mounts, as rendered (render/states/device_plugin.py).
STAND_IN = "gpu_operator.sim.standins.deviceplugin"
ENTRY = f"""#!/bin/sh
# gpu-operator simulator: NVIDIA's device plugin played by its stand-in inside this pod.
exec python3.11 -m {STAND_IN} --host-root=/host \\
  --plugin-dir=/var/lib/kubelet/device-plugins --cdi-root=/ "$@"
"""
PACKAGES = ("grpc", "google/protobuf", "google/_upb")
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def _site_packages() -> Path:
    import grpc

    return Path(grpc.__file__).parents[1]


def library_files() -> dict[str, bytes]:
    """The stand-in's gRPC and protobuf packages, as image paths under our image's site directory."""
    if sys.version_info[:2] != PYTHON:
        raise RuntimeError(
            f"the device plugin's image is built from this Python's gRPC libraries, which must be "
            f"Python {PYTHON[0]}.{PYTHON[1]}'s (our image's); this is "
            f"{sys.version_info[0]}.{sys.version_info[1]}: run the simulator with Python 3.11"
        )
    site = _site_packages()
    files = {f"{LIBDIR}/libstdc++.so.6": _loaded("libstdc++.so.6").read_bytes()}
    for package in PACKAGES:
        for path in sorted((site / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[f"{SITE}/{path.relative_to(site)}"] = path.read_bytes()
    return files


def _loaded(soname: str) -> Path:
    """The file of shared library `soname` as this process loaded it (gRPC's extension links it)."""
    import grpc._cython.cygrpc  # noqa: F401  (loads it)

    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1] if len(line.split()) == 6 else ""
        if Path(path).name.startswith(soname):
            return Path(path)
    raise RuntimeError(
        f"the device plugin's image needs {soname}, which gRPC's extension loads, "
        "but this process has not loaded it: install libstdc++6"
    )


def build(base: Path, out: Path, ref: str = DEVICE_PLUGIN_IMAGE) -> Path:
    """A docker-archive at `out`: our image (docker-archive `base`) plus the stand-in's layer, tagged `ref`."""
    return ociarchive.extend(
        base,
        out,
        ref,
        {**library_files(), EXECUTABLE: ENTRY.encode()},
        "gpu-operator sim: device-plugin stand-in",
        user="0:0",
    )
