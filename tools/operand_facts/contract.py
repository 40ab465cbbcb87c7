"""Operand contracts: what each image needs (recorded as data) checked against rendered objects.

Each state has a contract file in tools/operand_facts/contracts/<state>.yaml: upstream's facts for its
DaemonSets (containers, the program each runs, env, mounts, privilege, probes, status files),
its RBAC and Services, the env upstream's run-time transforms may set, and the deviations we
make on purpose, each with its reason. `compare` lists every difference between a render and
the contracts as a `Deviation`; `undocumented` keeps those no contract explains.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.render.result import Manifest, RenderResult
from gpu_operator.vocabulary import VALIDATIONS_DIR

CONTRACTS = Path(__file__).parent / "contracts"
WRAPPERS = ("sh", "/bin/sh", "bash", "/bin/bash", "-c", "-e", "-ec", "-xe", "-xc")
SHARED = "_shared.yaml"  # deliberate deviations that hold for every state
# Values upstream's manifests leave for its run-time transforms to fill in are recorded as this
# marker of ours: only the variable's (or volume's, object's) presence counts.
RUN_TIME = "<set at run time>"
_UPSTREAM_PLACEHOLDER = re.compile(r"filled[ _]by[ _](the[ _])?operator", re.IGNORECASE)


def run_time(value: str) -> str:
    """A recorded value: upstream's fill-in placeholder (in any of its spellings) becomes RUN_TIME."""
    return RUN_TIME if _UPSTREAM_PLACEHOLDER.fullmatch(value.strip()) else value


@dataclass(frozen=True, order=True)
class Deviation:
    """One difference from a contract; `id` is what a contract's `deliberate` globs match."""

    state: str
    id: str
    detail: str

    def __str__(self) -> str:
        return f"{self.id}: {self.detail}"


@dataclass(frozen=True)
class Contract:
    state: str
    data: dict[str, Any]

    @property
    def deliberate(self) -> dict[str, str]:
        out = self.data.get("deliberate") or {}
        assert isinstance(out, dict)
        return {str(k): str(v) for k, v in out.items()}

    def explains(self, deviation: Deviation) -> str | None:
        """The reason a deliberate entry (this state's, then the shared ones) gives, or None."""
        for pattern, reason in [*self.deliberate.items(), *shared_deliberate().items()]:
            if fnmatch.fnmatchcase(deviation.id, pattern):
                return reason
        return None


@functools.cache
def shared_deliberate() -> dict[str, str]:
    data = yaml.safe_load((CONTRACTS / SHARED).read_text()) or {}
    return {str(k): str(v) for k, v in (data.get("deliberate") or {}).items()}


@functools.cache
def contracts() -> dict[str, Contract]:
    """Every state's contract, by state name."""
    out: dict[str, Contract] = {}
    for path in sorted(CONTRACTS.glob("*.yaml")):
        if path.name == SHARED:
            continue
        data = yaml.safe_load(path.read_text())
        out[data["state"]] = Contract(data["state"], data)
    return out


def runs(ctr: Manifest) -> str:
    """The program a container starts: without shell wrappers, the word after the last `exec`
    of an inline script (wait loops end with one), else the first word."""
    words: list[str] = []
    for part in [*(ctr.get("command") or []), *(ctr.get("args") or [])]:
        words.extend(str(part).split())
    words = [w for w in words if w not in WRAPPERS]
    if "exec" in words[:-1]:
        return words[len(words) - 1 - words[::-1].index("exec") + 1]
    return words[0] if words else "<image entrypoint>"


def _env(ctr: Manifest) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in ctr.get("env") or []:
        if "valueFrom" in entry:
            ref = entry["valueFrom"].get("fieldRef", {}).get("fieldPath", "")
            out[entry["name"]] = f"fieldRef:{ref}" if ref else "valueFrom"
        else:
            out[entry["name"]] = run_time(str(entry.get("value", "")))
    return out


def _source(volume: Manifest) -> str:
    if "hostPath" in volume:
        return f"hostPath:{volume['hostPath']['path']}"
    if "configMap" in volume:
        return f"configMap:{run_time(volume['configMap'].get('name', ''))}"
    if "secret" in volume:
        return f"secret:{volume['secret'].get('secretName', '')}"
    return next(iter(k for k in volume if k != "name"), "")


def container_facts(ds: Manifest) -> dict[str, dict[str, Any]]:
    """Per container of a DaemonSet: the program, env, mounts (with their sources), privilege, probes."""
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: _source(v) for v in pod.get("volumes") or []}
    out: dict[str, dict[str, Any]] = {}
    for kind in ("initContainers", "containers"):
        for ctr in pod.get(kind) or []:
            sc = ctr.get("securityContext") or {}
            out[ctr["name"]] = {
                "init": kind == "initContainers",
                "command": [*(ctr.get("command") or []), *(ctr.get("args") or [])],
                "runs": runs(ctr),
                "env": _env(ctr),
                "mounts": {
                    m["mountPath"]: volumes.get(m["name"], m["name"])
                    + (f" ({m['mountPropagation']})" if m.get("mountPropagation") else "")
                    for m in ctr.get("volumeMounts") or []
                },
                "privileged": bool(sc.get("privileged")),
                "runAsUser": sc.get("runAsUser"),
                "probes": sorted(k for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in ctr),
            }
    return out


def rule_strings(role: Manifest) -> set[str]:
    """A Role's rules as `group resource verb [names]` strings (OpenShift's SCC rule left out)."""
    out: set[str] = set()
    for rule in role.get("rules") or []:
        for group in rule.get("apiGroups") or [""]:
            if group == "security.openshift.io":
                continue
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    names = ",".join(rule.get("resourceNames") or [])
                    out.add(f"{group or 'core'} {resource} {verb}" + (f" {names}" if names else ""))
    return out


def _diff(state: str, prefix: str, ours: set[str], theirs: set[str], what: str) -> list[Deviation]:
    return [
        Deviation(state, f"{prefix}:{what}-missing:{x}", f"upstream has {what} {x}; we do not")
        for x in sorted(theirs - ours)
    ] + [
        Deviation(state, f"{prefix}:{what}-extra:{x}", f"we add {what} {x}; upstream does not")
        for x in sorted(ours - theirs)
    ]


def _check_container(state: str, prefix: str, ours: dict[str, Any], fact: dict[str, Any]) -> list[Deviation]:
    out: list[Deviation] = []
    if fact.get("runs") and ours["runs"] != fact["runs"]:
        out.append(Deviation(state, f"{prefix}:runs", f"runs {ours['runs']}; upstream runs {fact['runs']}"))
    theirs_env: dict[str, str] = {k: str(v) for k, v in (fact.get("env") or {}).items()}
    transform = set(fact.get("transform_env") or [])
    for name in sorted(set(theirs_env) | set(ours["env"])):
        mine, theirs = ours["env"].get(name), theirs_env.get(name)
        if theirs is None:
            if name not in transform:
                out.append(
                    Deviation(
                        state, f"{prefix}:env-extra:{name}", f"we set {name}={mine!r}; upstream does not"
                    )
                )
        elif mine is None:
            if name not in transform:
                out.append(
                    Deviation(
                        state, f"{prefix}:env-missing:{name}", f"upstream sets {name}={theirs!r}; we do not"
                    )
                )
        elif mine != theirs and theirs != RUN_TIME and name not in transform:
            out.append(
                Deviation(state, f"{prefix}:env-value:{name}", f"{name}={mine!r}; upstream {theirs!r}")
            )
    theirs_mounts: dict[str, str] = fact.get("mounts") or {}
    transform_mounts = set(fact.get("transform_mounts") or [])
    for path in sorted(set(theirs_mounts) | set(ours["mounts"])):
        mine, theirs = ours["mounts"].get(path), theirs_mounts.get(path)
        if path in transform_mounts:
            continue
        if theirs is None:
            out.append(
                Deviation(
                    state, f"{prefix}:mount-extra:{path}", f"we mount {mine} at {path}; upstream does not"
                )
            )
        elif mine is None:
            out.append(
                Deviation(
                    state, f"{prefix}:mount-missing:{path}", f"upstream mounts {theirs} at {path}; we do not"
                )
            )
        elif mine != theirs and RUN_TIME not in theirs:
            out.append(
                Deviation(state, f"{prefix}:mount-source:{path}", f"{path} is {mine}; upstream {theirs}")
            )
    if bool(fact.get("privileged")) != ours["privileged"]:
        out.append(
            Deviation(
                state,
                f"{prefix}:privileged",
                f"privileged={ours['privileged']}; upstream {bool(fact.get('privileged'))}",
            )
        )
    if fact.get("runAsUser") is not None and ours["runAsUser"] != fact["runAsUser"]:
        out.append(
            Deviation(
                state, f"{prefix}:runAsUser", f"runAsUser={ours['runAsUser']}; upstream {fact['runAsUser']}"
            )
        )
    out += _diff(state, prefix, set(ours["probes"]), set(fact.get("probes") or []), "probe")
    status = [*(fact.get("reads") or []), *(fact.get("writes") or [])]
    if status and not any(p in (VALIDATIONS_DIR, "/run/nvidia") for p in ours["mounts"]):
        out.append(
            Deviation(
                state,
                f"{prefix}:status-files",
                f"reads/writes {', '.join(status)} but does not mount {VALIDATIONS_DIR}",
            )
        )
    return out


def _check_daemonset(state: str, ds: Manifest, fact: dict[str, Any]) -> list[Deviation]:
    name = ds["metadata"]["name"]
    out: list[Deviation] = []
    pod = ds["spec"]["template"]["spec"]
    for key, value in (fact.get("pod") or {}).items():
        if pod.get(key) != value:
            out.append(Deviation(state, f"{name}:pod:{key}", f"{key}={pod.get(key)}; upstream {value}"))
    ours = container_facts(ds)
    theirs: dict[str, dict[str, Any]] = fact.get("containers") or {}
    for ctr in sorted(set(ours) | set(theirs)):
        prefix = f"{name}/{ctr}"
        if ctr not in theirs:
            out.append(
                Deviation(state, f"{prefix}:container-extra", "we add this container; upstream does not")
            )
        elif ctr not in ours:
            if not theirs[ctr].get("optional"):
                out.append(
                    Deviation(state, f"{prefix}:container-missing", "upstream runs this container; we do not")
                )
        else:
            out += _check_container(state, prefix, ours[ctr], theirs[ctr])
    return out


def compare_state(state: str, objects: list[Manifest]) -> list[Deviation]:
    """Every difference between one enabled state's rendered objects and its contract."""
    contract = contracts().get(state)
    if contract is None:
        return [Deviation(state, f"{state}:no-contract", "no contract file for this state")]
    data = contract.data
    out: list[Deviation] = []
    ours_ds = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DaemonSet"}
    facts: dict[str, Any] = data.get("daemonsets") or {}
    variants: dict[str, str] = data.get("daemonset_variants") or {}
    for name, ds in ours_ds.items():
        base = next((b for pattern, b in variants.items() if fnmatch.fnmatchcase(name, pattern)), name)
        if base not in facts:
            out.append(
                Deviation(state, f"{name}:daemonset-extra", "we render this DaemonSet; upstream does not")
            )
            continue
        out += _check_daemonset(state, ds, facts[base])
    theirs_objects = {o for o in data.get("upstream_objects") or []}
    if theirs_objects:
        ours_objects = {f"{o['kind']}/{o['metadata']['name']}" for o in objects}
        for ref in sorted(ours_objects - theirs_objects):
            out.append(
                Deviation(state, f"{state}:object-extra:{ref}", "we render this object; upstream does not")
            )
    for kind in ("Role", "ClusterRole"):
        # the SCC rule is OpenShift's (we add it there only)
        theirs = {
            r for r in (data.get("rbac") or {}).get(kind) or [] if not r.startswith("security.openshift.io")
        }
        account = data.get("account")
        ours: set[str] = set()
        for o in objects:
            if o["kind"] == kind and (account is None or o["metadata"]["name"] == account):
                ours |= rule_strings(o)
        out += _diff(state, f"{state}:{kind}", ours, theirs, "rule")
    for name, svc in (data.get("services") or {}).items():
        found = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == name]
        if not found:
            out.append(
                Deviation(state, f"{name}:service-missing", "upstream renders this Service; we do not")
            )
            continue
        annotations = found[0]["metadata"].get("annotations") or {}
        for key, value in (svc.get("annotations") or {}).items():
            if annotations.get(key) != value:
                out.append(
                    Deviation(state, f"{name}:service-annotation:{key}", f"upstream sets {key}={value!r}")
                )
        ports = sorted(p["port"] for p in found[0]["spec"].get("ports") or [])
        if ports != sorted(svc.get("ports") or []):
            out.append(
                Deviation(state, f"{name}:service-ports", f"ports {ports}; upstream {svc.get('ports')}")
            )
    return out


def compare(result: RenderResult) -> list[Deviation]:
    """Deviations of every enabled state of a render."""
    out: list[Deviation] = []
    for state in result.states:
        if state.enabled and state.objects:
            out += compare_state(state.name, state.objects)
    return out


def undocumented(deviations: list[Deviation]) -> list[Deviation]:
    """Deviations no contract's `deliberate` entry explains."""
    table = contracts()
    return [d for d in deviations if d.state not in table or table[d.state].explains(d) is None]
