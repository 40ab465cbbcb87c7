"""The health agent's side of remediation: the operator's requests in its Node's annotations
(controllers/health_machine.py writes them), carried out on the host and reported back.

- `nvidia.com/gpu-health.reset-requested` = comma-separated bus ids, or `all`: each GPU that is
  still on the bus and that no host process holds (an open /dev/nvidia<minor>, `node/holders.py`)
  is reset with NVIDIA's `nvidia-smi -r -i <bus>` (run through the driver's root as the validator
  finds it, `node/driver.py`). A GPU something holds is never reset: refused, and tried again at
  the next step (the holder may go); a GPU gone from the bus is refused for good (only a reboot
  brings it back); a failed reset is not repeated for the same request (one per remediation
  attempt: the bus ids with the machine's `since` stamp). When every GPU asked for
  is reset, the agent removes the annotation. Outcomes per GPU go into the report's `reset`:
  `done`, `refused:<why>`, `failed:<why>` (the last request's, until another one comes).
- `nvidia.com/gpu-health.reboot-requested` = the operator's epoch: the agent creates kured's
  reboot sentinel (`/var/run/reboot-required` on the host, kured's default `--reboot-sentinel`)
  once per request, puts the request in the report's `reboot`, and removes the annotation. kured
  (or whatever reads the sentinel) reboots the node in its window; after the reboot the agent
  starts afresh and its report says what the host is then.

`RequestActor.act(...)` is pure of Kubernetes: the caller reads the annotations and removes the
ones it is told are handled (agent.py's loop, the simulator's stand-in).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpu_operator.node.holders import GpuHolder, gpu_holders
from gpu_operator.node.hostfs import HostFS, HostPathError
from gpu_operator.node.pci import normalise_bus
from gpu_operator.vocabulary import HEALTH_REBOOT_REQUESTED, HEALTH_RESET_REQUESTED, HEALTH_SINCE_ANNOTATION

# kured's default --reboot-sentinel (kubereboot/kured, cmd/kured/main.go)
SENTINEL = "/var/run/reboot-required"
DONE, REFUSED, FAILED = "done", "refused", "failed"
MAX_WHY = 150
RESET_TIMEOUT = 120.0
NO_SUCH = "no such GPU on this node"
GONE = "gone from the bus (only a reboot brings it back)"
# outcomes that stay for the request (a GPU refused because something holds it is tried again)
FINAL = (DONE, FAILED, f"{REFUSED}:{NO_SUCH}", f"{REFUSED}:{GONE}")

# bus -> (ok, why not); the agent's resetter runs nvidia-smi, the simulator's plays it on a host tree
Resetter = Callable[[str], tuple[bool, str]]


def smi_resetter(fs: HostFS, runner: object | None = None) -> Resetter:
    """`nvidia-smi -r -i <bus>` where the driver's root has it (the host's, or the operator's
    driver root /run/nvidia/driver), found when a reset is asked for (the driver may come later)."""
    from gpu_operator.node.driver import detect_driver
    from gpu_operator.node.runner import CommandRunner, HostRunner

    run: CommandRunner = runner if runner is not None else HostRunner(fs)  # type: ignore[assignment]

    def reset(bus: str) -> tuple[bool, str]:
        driver = detect_driver(fs)
        if driver.smi_in_root is None:
            return False, "nvidia-smi not found on the host or in the driver root"
        result = run.run([driver.smi_in_root, "-r", "-i", bus], root=driver.run_root, timeout=RESET_TIMEOUT)
        return result.ok, result.summary()

    return reset


def _why(text: str) -> str:
    return " ".join(text.split())[:MAX_WHY] or "no reason given"


@dataclass
class Handled:
    """What the agent did with the annotations this step."""

    withdraw: list[str] = field(default_factory=list)  # request annotations to remove
    reset: list[str] = field(default_factory=list)  # GPUs reset now (their Xid state is cleared)


class RequestActor:
    """Carries out reset and reboot requests on one host (`fs`), remembering what it did."""

    def __init__(self, fs: HostFS, resetter: Resetter, *, sentinel: str = SENTINEL,
                 holders: Callable[[HostFS], list[GpuHolder]] = gpu_holders, own_pid: int | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.fs, self.resetter, self.sentinel, self.holders, self.log = fs, resetter, sentinel, holders, log
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self.reset_request: str | None = None  # the request the outcomes are for
        self.outcomes: dict[str, str] = {}  # bus -> done | refused:.. | failed:.. (the report's `reset`)
        self.reboot: str | None = None  # the reboot request the sentinel was created for
        self.sentinel_writes = 0
        self.before_reset: Callable[[], None] | None = None  # the agent lets NVML go before a reset

    def report_fields(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.outcomes:
            out["reset"] = dict(sorted(self.outcomes.items()))
        if self.reboot is not None:
            out["reboot"] = self.reboot
        return out

    def act(self, annotations: Mapping[str, str], known: set[str], gone: set[str]) -> Handled:
        """`known`: the node's GPUs (bus ids, the agent's first look and now); `gone`: those that
        left the bus since."""
        handled = Handled()
        reboot = annotations.get(HEALTH_REBOOT_REQUESTED)
        if reboot is not None and self._reboot(reboot):
            handled.withdraw.append(HEALTH_REBOOT_REQUESTED)
        reset = annotations.get(HEALTH_RESET_REQUESTED)
        if reset is None:
            self.reset_request = None  # the outcomes stay in the report; the same text later is a new request
        # one request per remediation attempt: the machine stamps each state it enters (since), so
        # the same GPUs asked again by a later attempt are a new request even if the removal in
        # between was never seen
        elif self._reset(f"{reset}@{annotations.get(HEALTH_SINCE_ANNOTATION, '')}", reset, known, gone, handled):
            handled.withdraw.append(HEALTH_RESET_REQUESTED)
        return handled

    # -- reboot --

    def _reboot(self, request: str) -> bool:
        """Create the sentinel once per request; True when the request is handled."""
        if request == self.reboot:
            return True  # created already (the annotation's removal has not been seen yet)
        try:
            if self.fs.exists(self.sentinel):
                self.log(f"reboot requested ({request}): {self.sentinel} is there already; a reboot is pending")
            else:
                self.fs.write_text(self.sentinel, f"GPU health remediation requested a reboot (request {request})\n")
                self.sentinel_writes += 1
                self.log(f"reboot requested ({request}): created {self.sentinel} for the reboot daemon (kured)")
        except (HostPathError, OSError) as err:
            self.log(f"reboot requested ({request}): cannot create {self.sentinel}: {err} (trying again)")
            return False
        self.reboot = request
        return True

    # -- reset --

    def _wanted(self, request: str, known: set[str]) -> list[str]:
        if request.strip() == "all":
            return sorted(known)
        out = []
        for item in request.split(","):
            if not item.strip():
                continue
            try:
                out.append(normalise_bus(item))
            except ValueError:
                self.log(f"reset requested: {item!r} is no PCI bus id; skipped")
        return sorted(set(out))

    def _reset(self, request: str, buses: str, known: set[str], gone: set[str], handled: Handled) -> bool:
        """Reset what may be reset; True when every GPU asked for is reset."""
        if request != self.reset_request:
            self.reset_request, self.outcomes = request, {}
        wanted = self._wanted(buses, known)
        todo = [b for b in wanted if not self.outcomes.get(b, "").startswith(FINAL)]
        held = self._held(todo) if todo else {}
        for bus in todo:
            before = self.outcomes.get(bus)
            if bus not in known:
                self.outcomes[bus] = f"{REFUSED}:{NO_SUCH}"
            elif bus in gone:
                self.outcomes[bus] = f"{REFUSED}:{GONE}"
            elif bus in held:
                self.outcomes[bus] = f"{REFUSED}:{_why('held by ' + held[bus])}"
            else:
                if self.before_reset is not None:
                    self.before_reset()
                ok, why = self.resetter(bus)
                self.outcomes[bus] = DONE if ok else f"{FAILED}:{_why(why)}"
                if ok:
                    handled.reset.append(bus)
            if self.outcomes[bus] != before:
                self.log(f"reset requested for {bus}: {self.outcomes[bus]}")
        return bool(wanted) and all(self.outcomes.get(b) == DONE for b in wanted)

    def _held(self, buses: list[str]) -> dict[str, str]:
        """bus -> who holds it (processes with its /dev/nvidia<minor> open, this agent left out)."""
        out: dict[str, list[str]] = {}
        for holder in self.holders(self.fs):
            if holder.address in buses and holder.pid != self.own_pid:
                out.setdefault(holder.address, []).append(f"pid {holder.pid} ({holder.comm})")
        return {bus: ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                for bus, names in out.items()}
