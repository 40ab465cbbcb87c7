"""The real node's `nvidia` runtime handler: runc, with what NVIDIA's container toolkit would add
to each container of the `nvidia` RuntimeClass, by the toolkit's rules (`toolkit`, `cdi`) over the
node's host tree: the requested GPUs' device nodes, the driver's devices, binaries and libraries of
the requested capabilities, CDI edits. A container that asks for nothing is left as it is; one that
asks for what the host does not have fails to be created, with the toolkit's reason.

containerd's runc shim calls `<wrapper> [global flags] create --bundle DIR ... ID`; the wrapper
(`wrapper_script`) runs `python -m gpu_operator.sim.realnode.nvruntime HOST_ROOT RUNC ARGS...`.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from gpu_operator.sim.realnode.edits import Edits, InjectionError
from gpu_operator.sim.realnode.toolkit import edits_for

SANDBOX_ANNOTATION = "io.kubernetes.cri.container-type"
_FILE_OPTIONS = ["rbind", "ro", "nosuid", "nodev"]
_DEVICE_OPTIONS = ["rbind", "rw", "nosuid"]


def apply(config: dict[str, Any], edits: Edits) -> list[str]:
    """Add `edits` to an OCI config (devices bound from the host tree and allowed in the device
    cgroup, files bound read-only, env appended); returns the container paths added."""
    if edits.mode == "none":
        return []
    mounts = config.setdefault("mounts", [])
    present = {m.get("destination") for m in mounts}
    added = []
    for source, destination in edits.mounts:
        if destination not in present:
            mounts.append(
                {
                    "destination": destination,
                    "type": "bind",
                    "source": str(source),
                    "options": list(_FILE_OPTIONS),
                }
            )
            present.add(destination)
            added.append(destination)
    for host, path, major, minor in edits.devices:
        rules = config.setdefault("linux", {}).setdefault("resources", {}).setdefault("devices", [])
        if path not in present:
            mounts.append(
                {"destination": path, "type": "bind", "source": str(host), "options": list(_DEVICE_OPTIONS)}
            )
            present.add(path)
            added.append(path)
        rules.append({"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"})
    if edits.env:
        config.setdefault("process", {}).setdefault("env", []).extend(edits.env)
        added.extend(f"env {item}" for item in edits.env)
    return added


def inject(config: dict[str, Any], host_root: Path) -> list[str]:
    """What the toolkit adds to one container (never to a pod sandbox: the pause container)."""
    if (config.get("annotations") or {}).get(SANDBOX_ANNOTATION) == "sandbox":
        return []
    return apply(config, edits_for(config, host_root))


def _runc_error(args: list[str], message: str) -> None:
    """Report as runc does: a JSON error line in its --log file (the shim shows it in the
    container's status), and on stderr."""
    print(message, file=sys.stderr)
    if "--log" in args[:-1]:
        line = {"level": "error", "msg": message, "time": datetime.datetime.now(datetime.UTC).isoformat()}
        with open(args[args.index("--log") + 1], "a") as log:
            log.write(json.dumps(line) + "\n")


def wrapper_script(host_root: Path, runc: str | None = None) -> str:
    """The executable containerd's shim is pointed at (runtime option BinaryName): runc (this
    machine's unless `runc` is given) with the toolkit's additions from the tree at `host_root`."""
    runc = runc or shutil.which("runc") or "/usr/sbin/runc"
    return (
        f'#!/bin/sh\nexec {sys.executable} -m gpu_operator.sim.realnode.nvruntime {host_root} {runc} "$@"\n'
    )


def main(argv: list[str]) -> None:
    host_root, runc, *args = argv
    if "create" in args and "--bundle" in args[:-1]:
        config_path = Path(args[args.index("--bundle") + 1]) / "config.json"
        config = json.loads(config_path.read_text())
        try:
            added = inject(config, Path(host_root))
        except InjectionError as err:
            _runc_error(args, f"nvidia-container-runtime: {err}")
            sys.exit(1)
        if added:
            config_path.write_text(json.dumps(config))
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
