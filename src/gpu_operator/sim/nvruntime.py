"""The real node's `nvidia` runtime handler: runc, with the fixture host's driver utilities bound
into every container it creates, as NVIDIA's container runtime binds the host's driver files into
GPU containers. The container toolkit (an NVIDIA image) does not run on the real node; this is
what its runtime would do for pods of the `nvidia` RuntimeClass, so the validator's toolkit check
really runs `nvidia-smi` inside its container.

containerd's runc shim calls `<wrapper> [global flags] create --bundle DIR ... ID`; the wrapper
(`wrapper_script`) runs `python -m gpu_operator.sim.nvruntime HOST_ROOT RUNC ARGS...`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# What NVIDIA's runtime would inject from a host with the driver installed (the utilities the
# validator and workloads call); library files of the fixture are empty placeholders, not bound.
INJECTED = ("/usr/bin/nvidia-smi",)
SANDBOX_ANNOTATION = "io.kubernetes.cri.container-type"


def inject(config: dict[str, Any], host_root: Path) -> list[str]:
    """Add read-only bind mounts of the host root's driver utilities to an OCI config (not to pod
    sandboxes: the pause container runs nothing of the driver); returns what was added."""
    if (config.get("annotations") or {}).get(SANDBOX_ANNOTATION) == "sandbox":
        return []
    mounts = config.setdefault("mounts", [])
    present = {m.get("destination") for m in mounts}
    added = []
    for path in INJECTED:
        source = host_root / path.lstrip("/")
        if path in present or not source.is_file():
            continue
        mounts.append({"destination": path, "type": "bind", "source": str(source),
                       "options": ["rbind", "ro", "nosuid", "nodev"]})
        added.append(path)
    return added


def wrapper_script(host_root: Path, runc: str) -> str:
    """The executable containerd's shim is pointed at (runtime option BinaryName)."""
    return f'#!/bin/sh\nexec {sys.executable} -m gpu_operator.sim.nvruntime {host_root} {runc} "$@"\n'


def main(argv: list[str]) -> None:
    host_root, runc, *args = argv
    if "--bundle" in args[:-1]:
        config_path = Path(args[args.index("--bundle") + 1]) / "config.json"
        config = json.loads(config_path.read_text())
        if inject(config, Path(host_root)):
            config_path.write_text(json.dumps(config))
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
