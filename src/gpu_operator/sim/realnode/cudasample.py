"""A stand-in for the CUDA sample the validator's workload pods run (`vectorAdd`; NVIDIA's image
ships it at /usr/bin/vectorAdd and cannot be pulled here), built without a registry: our image
with one more layer holding /usr/bin/vectorAdd, tagged CUDA_SAMPLE_IMAGE, imported into the real
node's containerd.

What the real sample needs before its first CUDA call succeeds, it checks, and nothing passes
without it: the driver's CUDA library `libcuda.so.1` in the container's library directory (the
toolkit mounts it from the host), the control devices /dev/nvidiactl and /dev/nvidia-uvm, and at
least one GPU /dev/nvidiaN, each a character device of the driver's major that the container's
device cgroup lets it open (opening it then fails with ENXIO, since no driver owns the major on
this machine; EPERM means the cgroup refused it). On success it prints what the sample prints; on
failure the sample's error line and which of these is missing, and exits 1.
"""

from __future__ import annotations

from pathlib import Path

from gpu_operator.sim.realnode import ociarchive

CUDA_SAMPLE_IMAGE = "localhost/gpu-operator-sim/cuda-sample:vectoradd"  # never pulled: imported
VECTOR_ADD = '''#!/usr/bin/env python3.11
"""vectorAdd stand-in (gpu-operator simulator): passes only with a GPU really given to the container."""
import errno, glob, os, re, stat, sys

LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64", "/usr/lib")


def reachable(path, major=None):
    try:
        st = os.stat(path)
    except OSError:
        return f"{path} is missing"
    if not stat.S_ISCHR(st.st_mode):
        return f"{path} is not a character device"
    if major is not None and os.major(st.st_rdev) != major:
        return f"{path} has major {os.major(st.st_rdev)}, not the driver's {major}"
    try:
        os.close(os.open(path, os.O_RDWR))
    except OSError as err:
        if err.errno == errno.EPERM:
            return f"{path}: the container's device cgroup does not allow it (EPERM)"
        if err.errno != errno.ENXIO:
            return f"{path}: {os.strerror(err.errno)}"
    return None


missing = []
if not any(os.path.exists(os.path.join(d, "libcuda.so.1")) for d in LIB_DIRS):
    missing.append("libcuda.so.1 (the driver's CUDA library) is in none of " + ", ".join(LIB_DIRS))
for path, major in (("/dev/nvidiactl", 195), ("/dev/nvidia-uvm", None)):
    problem = reachable(path, major)
    if problem:
        missing.append(problem)
gpus = [p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia[0-9]+", p)]
usable = [p for p in gpus if reachable(p, 195) is None]
if not usable:
    missing.append("no GPU device /dev/nvidiaN" + (": " + "; ".join(reachable(p, 195) for p in gpus) if gpus else ""))
print("[Vector addition of 50000 elements]")
if missing:
    print("Failed to allocate device vector A (error code no CUDA-capable device is detected)!")
    for problem in missing:
        print("vectorAdd stand-in: " + problem)
    sys.exit(1)
print("Copy input data from the host memory to the CUDA device")
print("CUDA kernel launch with 196 blocks of 256 threads")
print("Copy output data from the CUDA device to the host memory")
print("Test PASSED (stand-in: GPUs " + ", ".join(sorted(usable)) + ")")
print("Done")
'''


def build(base: Path, out: Path, ref: str = CUDA_SAMPLE_IMAGE) -> Path:
    """A docker-archive at `out`: the image of docker-archive `base` plus a layer with
    /usr/bin/vectorAdd, tagged `ref` (deterministic: same base, same bytes)."""
    return ociarchive.extend(
        base, out, ref, {"/usr/bin/vectorAdd": VECTOR_ADD.encode()}, "gpu-operator sim: vectorAdd stand-in"
    )
