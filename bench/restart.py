"""The scale benchmark's restart phase (`--restart`): at the end of the idle window, the operator
is stopped with SIGTERM and the same command started again; measured from the SIGTERM:

- `stopped`: the old process has exited;
- `ready`: the new process's /readyz answers 200 (with leader election a standby answers too);
- `leads`: the Lease's holderIdentity names a holder other than the old one (read from the Lease
  object; None when no Lease exists: leader election off);
- `caught up`: every loop that had passed (`gpu_operator_controller_passes_total{result="ok"}`)
  in the old process has passed at least once in the new one;
- the operator's writes (apiserver audit log, its ServiceAccount, Leases excluded) from the
  SIGTERM until caught up, and in an idle window of the same length as the run's after that.

A new process that exits before it has caught up (it gives up a Lease it could not renew within
its renew deadline, as an overloaded apiserver makes it) is started again at once, as the
kubelet restarts the operator's container (without its back-off): its exits are listed, and the
figures are the last process's, still counted from the SIGTERM.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchkit import audit_writes, completed, proc_stats
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.coordination_v1 import Lease
from prometheus_client.parser import text_string_to_metric_families
from subjects import Subject

from gpu_operator.controllers.leader import LEASE_NAME
from gpu_operator.sim.plane.auditlog import AuditReader

PASSES = "gpu_operator_controller_passes"


def ok_passes(port: int | None) -> dict[str, float]:
    """{loop: ok passes} from an operator's /metrics ({} when it serves none, or not yet)."""
    if port is None:
        return {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == PASSES:
            for sample in family.samples:
                if sample.name == PASSES + "_total" and sample.labels.get("result") == "ok":
                    counts[sample.labels["loop"]] = counts.get(sample.labels["loop"], 0.0) + sample.value
    return counts


def nodes_patched(events: list[dict[str, Any]], user: str) -> dict[str, int]:
    """{node: patches by `user`} among audit `events`: how many nodes a burst of node patches
    touched, and whether any was patched more than once."""
    counts: dict[str, int] = {}
    for event in events:
        ref = event.get("objectRef") or {}
        if (
            event.get("user", {}).get("username") == user
            and event.get("verb") == "patch"
            and ref.get("resource") == "nodes"
            and not ref.get("subresource")
        ):
            counts[ref.get("name", "?")] = counts.get(ref.get("name", "?"), 0) + 1
    return counts


def lease_holder(sync: Client, namespace: str) -> str | None:
    """The Lease's holderIdentity ("" when released); None when there is no Lease."""
    try:
        lease = sync.get(Lease, LEASE_NAME, namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise
    return (lease.spec.holderIdentity if lease.spec else None) or ""


def answers_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def restart(
    old: Subject,
    relaunch: Callable[[], Subject],
    running: list[Subject],
    sync: Client,
    namespace: str,
    audit_log: Path,
    user: str,
    idle_seconds: float,
    timeout: float,
) -> dict[str, Any]:
    """Stop `old`, start `relaunch()` (appended to `running`, so the caller's cleanup stops it)
    and measure as the module says. Blocking: run it in a thread."""
    out: dict[str, Any] = {}
    loops = sorted(loop for loop, n in ok_passes(old.metrics_port).items() if n > 0)
    holder0 = lease_holder(sync, namespace)
    out["restart_loops"], out["restart_lease_before"] = loops, holder0
    audit = AuditReader.from_now(audit_log)
    t0 = time.monotonic()
    out["restart_old_exit"] = old.stop(60)
    out["restart_stopped_s"] = time.monotonic() - t0
    new = relaunch()
    running.append(new)
    out["restart_started_s"] = time.monotonic() - t0
    ready = leads = caught = None
    holder: str | None = None
    held = {holder0}  # holders before the process now measured: it leads when the Lease names another
    passes: dict[str, float] = {}
    exits: list[dict[str, Any]] = []
    while time.monotonic() - t0 < timeout:
        now = time.monotonic() - t0
        if (code := new.process.poll()) is not None:
            exits.append({"at_s": now, "exit": code, "ready_s": ready, "leads_s": leads})
            if len(exits) > 3:
                break
            held.add(lease_holder(sync, namespace) if holder is None else holder)
            new = relaunch()
            running.append(new)
            ready = leads = caught = None
            continue
        if ready is None and answers_ready(new.health_port):
            ready = now
        if leads is None and holder0 is not None:
            holder = lease_holder(sync, namespace)
            if holder and holder not in held:
                leads = now
        if caught is None and (leads is not None or holder0 is None):
            passes = ok_passes(new.metrics_port)
            if loops and all(passes.get(loop, 0) > 0 for loop in loops):
                caught = now
        if ready is not None and caught is not None and (leads is not None or holder0 is None):
            break
        time.sleep(0.2)
    out["restart_ready_s"], out["restart_leads_s"], out["restart_caught_up_s"] = ready, leads, caught
    out["restart_lease_after"] = holder if holder0 is not None else lease_holder(sync, namespace)
    out["restart_passes_at_caught_up"] = passes
    out["restart_exits"] = exits
    events = list(completed(audit))
    out["restart_catchup_writes"], out["restart_catchup_writes_by_kind"] = audit_writes(events, user)
    if new.process.poll() is not None:  # gave up: no idle window to measure
        out["restart_new_exit"] = new.process.returncode
        return out
    cpu0, t1 = proc_stats(new.pid).cpu_seconds, time.monotonic()
    time.sleep(idle_seconds)
    idle = list(completed(audit))
    out["restart_idle_writes"], out["restart_idle_writes_by_kind"] = audit_writes(idle, user)
    patched = nodes_patched(events + idle, user)  # from the SIGTERM to the end of the window
    out["restart_nodes_patched"] = len(patched)
    out["restart_nodes_patched_more_than_once"] = sum(1 for n in patched.values() if n > 1)
    out["restart_writes"] = out["restart_catchup_writes"] + out["restart_idle_writes"]
    if new.process.poll() is not None:  # exited during the window
        out["restart_new_exit"] = new.process.returncode
        return out
    stats = proc_stats(new.pid)
    out["restart_idle_cpu_fraction"] = (stats.cpu_seconds - cpu0) / max(1e-9, time.monotonic() - t1)
    out["restart_cpu_s"], out["restart_rss_peak_mb"] = stats.cpu_seconds, stats.rss_peak_mb
    out["restart_new_exit"] = new.stop(60)
    return out
