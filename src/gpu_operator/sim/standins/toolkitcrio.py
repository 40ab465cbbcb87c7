"""What NVIDIA's container toolkit (nvidia-ctk-installer v1.20.0 with RUNTIME=crio) writes on a CRI-O
host, played on a host tree through the toolkit pod's own channel, its env and hostPath mounts (the
facts, with file and line: docs/distributions.md, "CRI-O: what the toolkit does"):

- CRIO_CONFIG_MODE picks the mode: `config` (the toolkit's default; NVIDIA's operator sets it with
  CDI on) or `hook` (the operator's choice with CDI off); anything else is refused, as the toolkit
  refuses it;
- config mode writes one TOML file, the drop-in RUNTIME_DROP_IN_CONFIG (default
  /etc/crio/crio.conf.d/99-nvidia.toml; set empty: the top-level config RUNTIME_CONFIG itself),
  holding only its runtimes: `nvidia`, `nvidia-cdi` and `nvidia-legacy` under
  [crio.runtime.runtimes], each `runtime_type = "oci"` with `runtime_path` the toolkit's binary
  under ROOT/toolkit, starting from the options of the current default runtime (then runc, crun) in
  the config source; with NVIDIA_RUNTIME_SET_AS_DEFAULT (default true) also
  [crio.runtime] default_runtime. The top-level config is read (as a `file` source), never written
  while a drop-in is set. Then it restarts CRI-O (`systemctl restart crio` in a chroot of the host):
  here, whatever reads the tree afterwards plays CRI-O's start;
- hook mode writes the OCI hook JSON oci-nvidia-hook.json (CRIO_HOOK_FILENAME) into CRIO_HOOKS_DIR
  (default /usr/share/containers/oci/hooks.d) and restarts nothing (CRI-O watches its hooks dirs);
- on shutdown (`cleanup`): hook mode removes the hook file; config mode only unsets its own
  default_runtime and restarts CRI-O, and only when it set itself as default: the drop-in stays.

A path of the container lands on the host only through a hostPath mount (`toolkitfiles.host_path`);
a write no hostPath mount holds stays in the container and is not made here.
Not played: the `command` config source (`crio status config` asks a running CRI-O; none runs in a
tree: the toolkit then falls through to the next source), the toolkit's own install and config.toml.
"""

from __future__ import annotations

import copy
import json
import posixpath
import tomllib
from pathlib import Path
from typing import Any

from gpu_operator.sim.realnode.edits import InjectionError
from gpu_operator.sim.standins.toolkitfiles import Mounts, host_path, source, write_toml

MODES = ("config", "hook")
HOOKS_DIR = "/usr/share/containers/oci/hooks.d"
HOOK_FILE = "oci-nvidia-hook.json"
CONFIG = "/etc/crio/crio.conf"
DROP_IN = "/etc/crio/crio.conf.d/99-nvidia.toml"
RUNTIMES = ("crio", "runtime", "runtimes")
HOOK_BINARY = "nvidia-container-runtime-hook"
_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _first(env: dict[str, str], names: tuple[str, ...], default: str) -> str:
    """The first of `names` set in the env (the toolkit's flag sources, in its order)."""
    return next((env[n] for n in names if env.get(n)), default)


def _flag(env: dict[str, str], names: tuple[str, ...], default: bool) -> bool:
    value = _first(env, names, "").lower()
    if not value:
        return default
    if value in ("1", "t", "true"):
        return True
    if value in ("0", "f", "false"):
        return False
    raise InjectionError(f"{names[0]}={value!r} is not a boolean (true or false)")


def mode(env: dict[str, str]) -> str:
    found = env.get("CRIO_CONFIG_MODE") or "config"
    if found not in MODES:
        raise InjectionError(
            f"invalid cri-o config mode CRIO_CONFIG_MODE={found!r}: use one of {', '.join(MODES)}"
        )
    return found


def toolkit_dir(env: dict[str, str]) -> str:
    """Where the toolkit installs its binaries: <ROOT>/toolkit (TOOLKIT_INSTALL_DIR or ROOT)."""
    return posixpath.join(_first(env, ("TOOLKIT_INSTALL_DIR", "ROOT"), "/usr/local/nvidia"), "toolkit")


def runtime_name(env: dict[str, str]) -> str:
    return _first(env, ("NVIDIA_RUNTIME_NAME", "CONTAINERD_RUNTIME_CLASS", "DOCKER_RUNTIME_NAME"), "nvidia")


def set_as_default(env: dict[str, str]) -> bool:
    return _flag(
        env, ("NVIDIA_RUNTIME_SET_AS_DEFAULT", "CONTAINERD_SET_AS_DEFAULT", "DOCKER_SET_AS_DEFAULT"), True
    )


def runtimes(env: dict[str, str]) -> dict[str, str]:
    """The toolkit's runtimes, name -> binary: the nvidia runtime (its configured name, `nvidia` where
    that names a mode runtime) and one per mode, cdi and legacy."""
    name = runtime_name(env)
    main = "nvidia" if name in ("nvidia-cdi", "nvidia-legacy") else name
    root = toolkit_dir(env)
    out = {main: f"{root}/nvidia-container-runtime"}
    out.update({f"nvidia-{m}": f"{root}/nvidia-container-runtime.{m}" for m in ("cdi", "legacy")})
    return out


def _paths(env: dict[str, str]) -> tuple[str, str]:
    """(config, where it flushes): the top-level config and the drop-in, or the config itself where
    RUNTIME_DROP_IN_CONFIG is set empty."""
    config = _first(env, ("RUNTIME_CONFIG", "CONTAINERD_CONFIG", "DOCKER_CONFIG"), CONFIG)
    drop_in = env.get("RUNTIME_DROP_IN_CONFIG", DROP_IN)
    return config, drop_in or config


def _table(doc: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any] | None:
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None  # type: ignore[assignment]
    return doc if isinstance(doc, dict) else None


def default_options(found: dict[str, Any]) -> dict[str, Any]:
    """The options the nvidia runtimes start from: the source's default runtime's table (unless it
    is an nvidia one), else runc's, else crun's; none when the source has none of them."""
    default = (_table(found, ("crio", "runtime")) or {}).get("default_runtime")
    names = [default] if isinstance(default, str) and default and not default.startswith("nvidia") else []
    for name in [*names, "runc", "crun"]:
        table = _table(found, (*RUNTIMES, name))
        if table is not None:
            return copy.deepcopy(table)
    return {}


def hook(executable: str) -> dict[str, Any]:
    """The OCI hook (containers' hook schema 1.0.0) the toolkit writes for its runtime hook."""
    directory = posixpath.dirname(executable)
    path = [*_PATH, *([directory] if directory not in _PATH else [])]
    return {
        "version": "1.0.0",
        "hook": {
            "path": executable,
            "args": [posixpath.basename(executable), "prestart"],
            "env": ["PATH=" + ":".join(path)],
        },
        "when": {"always": True, "commands": [".*"]},
        "stages": ["prestart"],
    }


def _hook_file(env: dict[str, str]) -> str:
    return posixpath.join(env.get("CRIO_HOOKS_DIR") or HOOKS_DIR, env.get("CRIO_HOOK_FILENAME") or HOOK_FILE)


def configure(env: dict[str, str], mounts: Mounts, tree: Path) -> list[str]:
    """What the toolkit's setup writes on the host whose root is `tree`; returns the host paths written."""
    if mode(env) == "hook":
        landing = host_path(mounts, _hook_file(env))
        if landing is None:
            return []
        file = tree / landing.lstrip("/")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(hook(f"{toolkit_dir(env)}/{HOOK_BINARY}"), indent=2) + "\n")
        return [landing]
    config, target = _paths(env)
    options = default_options(source(tree, mounts, env, host_path(mounts, config)))
    doc: dict[str, Any] = {}
    table = doc.setdefault("crio", {}).setdefault("runtime", {})
    for name, binary in runtimes(env).items():
        table.setdefault("runtimes", {})[name] = {
            **copy.deepcopy(options),
            "runtime_path": binary,
            "runtime_type": "oci",
        }
    if set_as_default(env):
        table["default_runtime"] = runtime_name(env)
    landing = host_path(mounts, target)
    if landing is None:
        return []
    write_toml(tree, landing, doc)
    return [landing]


def cleanup(env: dict[str, str], mounts: Mounts, tree: Path) -> list[str]:
    """What the toolkit's shutdown changes on the host; returns the host paths removed or rewritten."""
    if mode(env) == "hook":
        landing = host_path(mounts, _hook_file(env))
        if landing is None or not (tree / landing.lstrip("/")).is_file():
            return []
        (tree / landing.lstrip("/")).unlink()
        return [landing]
    if not set_as_default(env):
        return []  # the toolkit leaves its drop-in as it is
    landing = host_path(mounts, _paths(env)[1])
    if landing is None or not (tree / landing.lstrip("/")).is_file():
        return []
    doc = tomllib.loads((tree / landing.lstrip("/")).read_text())
    runtime = _table(doc, ("crio", "runtime"))
    if runtime is not None and runtime.get("default_runtime") == runtime_name(env):
        del runtime["default_runtime"]
    write_toml(tree, landing, doc)  # then CRI-O's restart, as at setup
    return [landing]
