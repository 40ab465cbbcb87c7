"""The health agent's side of remediation: the operator's requests, carried out on the host and
answered in the agent's report.

Where a request comes from: one Secret in the operator's namespace (HEALTH_REQUESTS_SECRET), one
data key per node, written by the operator alone (controllers/units/health/machine.py decides,
controllers/units/health/executor.py writes); the agent may only get and watch that one Secret by name
(node/cluster/kubeapi.py's RequestWatch). Node annotations ask nothing: whoever may patch a Node (many
identities may) cannot make this agent reset or reboot anything. The agent acts on an entry only
when it is its own node's (`node`), remediation is on (`remediation`), and the remediation attempt
it belongs to is the one its Node is in: label HEALTH_STATE `validating`, annotations `since` and
`attempts` equal to the request's `since` and `attempt` (`admit`). A request of an earlier attempt,
or one left behind after the node was released, is ignored.

- `reset-gpu` (`gpus`: bus ids, or ["all"]): each GPU that is still on the bus and that no host
  process holds (an open /dev/nvidia<minor>, `node/host/holders.py`) is reset with NVIDIA's
  `nvidia-smi -r -i <bus>` (run through the driver's root as the validator finds it,
  `node/host/driver.py`). The agent lets its own NVML go first, and knows its own process by its host
  PID (`own_host_pid`): NSpid in the host's /proc/self/status. A GPU something holds is never
  reset: refused, and tried again at the next step (the holder may go); a GPU gone from the bus is
  refused for good (only a reboot brings it back); a failed reset is not repeated for the same
  request. Outcomes per GPU go into the report's `reset`: `done`, `refused:<why>`, `failed:<why>`.
- `reboot`: the agent creates kured's reboot sentinel (`/var/run/reboot-required` on the host,
  kured's default `--reboot-sentinel`) once per request; kured (or whatever reads the sentinel)
  reboots the node in its window; after the reboot the agent starts afresh.

A request carried out in full is named in the report's `answered` (the request's `id`); the
operator then withdraws it. The agent never writes the request.

`RequestActor.act(...)` is pure of Kubernetes: the caller gives what it sees (`Seen`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpu_operator.node.host.holders import GpuHolder, gpu_holders
from gpu_operator.node.host.hostfs import HostFS, HostPathError
from gpu_operator.node.host.pci import normalise_bus
from gpu_operator.vocabulary import (
    HEALTH_ATTEMPTS_ANNOTATION,
    HEALTH_REQUEST_ACTIONS,
    HEALTH_SINCE_ANNOTATION,
    HEALTH_STATE,
)

# kured's default --reboot-sentinel (kubereboot/kured, cmd/kured/main.go)
SENTINEL = "/var/run/reboot-required"
DONE, REFUSED, FAILED = "done", "refused", "failed"
MAX_WHY = 150
RESET_TIMEOUT = 120.0
QUERY_TIMEOUT = 30.0
NO_SUCH = "no such GPU on this node"
GONE = "gone from the bus (only a reboot brings it back)"
# outcomes that stay for the request (a GPU refused because something holds it is tried again)
FINAL = (DONE, FAILED, f"{REFUSED}:{NO_SUCH}", f"{REFUSED}:{GONE}")
VALIDATING = "validating"  # the machine's state while it waits for the agent (controllers/units/health/machine.py's VALIDATING)
_NSPID = re.compile(r"^NSpid:\s*(\d+)", re.MULTILINE)
_PID = re.compile(r"^Pid:\s*(\d+)", re.MULTILINE)

# bus -> (ok, why not); the agent's resetter runs nvidia-smi, the simulator's plays it on a host tree
Resetter = Callable[[str], tuple[bool, str]]


def own_host_pid(fs: HostFS) -> int | None:
    """This process's PID as the host numbers it: the first NSpid value in the host's
    /proc/self/status. `self` in a procfs resolves in the PID namespace that procfs was mounted in
    (the host's, under the host root), and NSpid lists the PIDs from that namespace inwards
    (kernel Documentation/filesystems/proc.rst, NSpid); without NSpid (kernels before 4.1), its
    Pid. None when it cannot be read: then no holder is taken for this agent (a reset refused
    rather than a GPU reset under a process)."""
    text = fs.read_text("/proc/self/status") or ""
    found = _NSPID.search(text) or _PID.search(text)
    return int(found.group(1)) if found else None


def host_boot_time(fs: HostFS) -> int | None:
    """When the host booted (epoch seconds): `btime` in the host's /proc/stat; None if unreadable."""
    found = re.search(r"^btime\s+(\d+)", fs.read_text("/proc/stat") or "", re.MULTILINE)
    return int(found.group(1)) if found else None


def smi_resetter(fs: HostFS, runner: object | None = None) -> Resetter:
    """`nvidia-smi -r -i <bus>` where the driver's root has it (the host's, or the operator's
    driver root /run/nvidia/driver), found when a reset is asked for (the driver may come later)."""
    from gpu_operator.node.host.driver import detect_driver
    from gpu_operator.node.host.runner import CommandRunner, HostRunner

    run: CommandRunner = runner if runner is not None else HostRunner(fs)  # type: ignore[assignment]

    def reset(bus: str) -> tuple[bool, str]:
        driver = detect_driver(fs)
        smi, root = driver.smi_in_root, driver.run_root
        if smi is None:
            return False, "nvidia-smi not found on the host or in the driver root"
        # persistence mode keeps the GPU open in the driver: off for the reset, back on after
        asked = run.run(
            [smi, "-i", bus, "--query-gpu=persistence_mode", "--format=csv,noheader"],
            root=root,
            timeout=QUERY_TIMEOUT,
        )
        persistent = asked.ok and asked.stdout.strip().lower() == "enabled"
        if persistent:
            off = run.run([smi, "-i", bus, "-pm", "0"], root=root, timeout=QUERY_TIMEOUT)
            if not off.ok:
                return False, f"persistence mode could not be turned off: {off.summary()}"
        result = run.run([smi, "-r", "-i", bus], root=root, timeout=RESET_TIMEOUT)
        if persistent:
            on = run.run([smi, "-i", bus, "-pm", "1"], root=root, timeout=QUERY_TIMEOUT)
            if not on.ok:
                return result.ok, f"{result.summary()}; persistence mode not turned back on: {on.summary()}"
        return result.ok, result.summary()

    return reset


def _why(text: str) -> str:
    return " ".join(text.split())[:MAX_WHY] or "no reason given"


@dataclass(frozen=True)
class Request:
    """One node's entry in the requests Secret."""

    node: str
    action: str
    gpus: tuple[str, ...]
    remediation: bool
    attempt: int
    since: str

    @property
    def id(self) -> str:
        """What the report's `answered` names once the request is carried out."""
        return f"{self.action}:{self.attempt}:{self.since}"

    @classmethod
    def parse(cls, text: str) -> Request:
        """The entry's JSON; ValueError naming the field for anything else."""
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ValueError(f"not JSON ({err})") from None
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError(
                f"field v: {data.get('v') if isinstance(data, dict) else data!r} (this agent reads v=1)"
            )
        node, action, gpus = data.get("node"), data.get("action"), data.get("gpus", [])
        if not isinstance(node, str) or not node:
            raise ValueError("field node: missing")
        if action not in HEALTH_REQUEST_ACTIONS:
            raise ValueError(f"field action: {action!r} is none of {', '.join(HEALTH_REQUEST_ACTIONS)}")
        if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
            raise ValueError("field gpus: not a list of bus ids")
        if not isinstance(data.get("remediation"), bool):
            raise ValueError("field remediation: not true or false")
        attempt, since = data.get("attempt"), data.get("since")
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
            raise ValueError("field attempt: not a whole number")
        if not isinstance(since, str) or not since.isdigit():
            raise ValueError("field since: not epoch seconds")
        return cls(node, action, tuple(gpus), data["remediation"], attempt, since)


@dataclass(frozen=True)
class Seen:
    """What the agent sees: its Node's labels and annotations (its own watch), and its node's entry
    in the requests Secret (None: none)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    request: str | None = None


def admit(seen: Seen, node: str) -> tuple[Request | None, str]:
    """The request to carry out, or None and why not ('' when nothing is asked)."""
    if seen.request is None:
        return None, ""
    try:
        request = Request.parse(seen.request)
    except ValueError as err:
        return None, f"the request for this node is unreadable: {err}"
    if request.node != node:
        return None, f"the request names node {request.node!r}, not this node ({node})"
    if not request.remediation:
        return None, "the request says remediation is off"
    state = seen.labels.get(HEALTH_STATE, "")
    since = seen.annotations.get(HEALTH_SINCE_ANNOTATION, "")
    attempts = seen.annotations.get(HEALTH_ATTEMPTS_ANNOTATION, "0")
    if (state, since, attempts) != (VALIDATING, request.since, str(request.attempt)):
        return None, (
            f"the request belongs to attempt {request.attempt} since {request.since}; the Node is in "
            f"state {state or '(none)'!r}, attempts {attempts}, since {since or '(none)'}"
        )
    return request, ""


@dataclass
class Handled:
    """What the agent did with a request this step."""

    answered: bool = False  # carried out in full
    reset: list[str] = field(default_factory=list)  # GPUs reset now (their Xid state is cleared)


class RequestActor:
    """Carries out reset and reboot requests on one host (`fs`), remembering what it did."""

    def __init__(
        self,
        fs: HostFS,
        resetter: Resetter,
        *,
        sentinel: str = SENTINEL,
        holders: Callable[[HostFS], list[GpuHolder]] = gpu_holders,
        own_pid: int | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.fs, self.resetter, self.sentinel, self.holders, self.log = fs, resetter, sentinel, holders, log
        self.own_pid = own_host_pid(fs) if own_pid is None else own_pid
        if self.own_pid is None:
            log(
                "this agent's host PID is unknown (no NSpid in the host's /proc/self/status): every process "
                "with a GPU open counts as a holder"
            )
        self.reset_request: str | None = None  # the request the outcomes are for
        self.outcomes: dict[str, str] = {}  # bus -> done | refused:.. | failed:.. (the report's `reset`)
        self.reboot: str | None = None  # the reboot request the sentinel was created for
        self.answered: str | None = None  # the last request carried out in full (its id)
        self.sentinel_writes = 0
        self.ignored = ""  # why the last request seen was not carried out (logged once per reason)
        self.before_reset: Callable[[], None] | None = None  # the agent lets NVML go before a reset

    def report_fields(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.outcomes:
            out["reset"] = dict(sorted(self.outcomes.items()))
        if self.reboot is not None:
            out["reboot"] = self.reboot
        if self.answered is not None:
            out["answered"] = self.answered
        return out

    def admit(self, seen: Seen, node: str) -> Request | None:
        request, why = admit(seen, node)
        if why and why != self.ignored:
            self.log(f"remediation request ignored: {why}")
        self.ignored = why
        return request

    def act(self, request: Request | None, known: set[str], gone: set[str]) -> Handled:
        """`request`: an admitted request (None: nothing asked); `known`: the node's GPUs (bus ids,
        the agent's first look and now); `gone`: those that left the bus since."""
        handled = Handled()
        if request is None:
            self.reset_request = None  # the outcomes stay in the report
            return handled
        if request.id == self.answered:
            return handled  # carried out already (its withdrawal not seen yet)
        if request.action == "reboot":
            handled.answered = self._reboot(request.id, int(request.since))
        else:
            handled.answered = self._reset(request.id, request.gpus, known, gone, handled)
        if handled.answered:
            self.answered = request.id
        return handled

    # -- reboot --

    def _reboot(self, request: str, since: int) -> bool:
        """Create the sentinel once per request; True when the request is handled. A host that
        booted after the request was made has rebooted: answered, no new sentinel (the agent of the
        new boot must not reboot the node again while the request is not withdrawn yet)."""
        if request == self.reboot:
            return True
        booted = host_boot_time(self.fs)
        if booted is not None and booted > since:
            self.log(
                f"reboot requested ({request}): the host booted after the request (btime {booted}): done"
            )
            self.reboot = request
            return True
        try:
            if self.fs.exists(self.sentinel):
                self.log(
                    f"reboot requested ({request}): {self.sentinel} is there already; a reboot is pending"
                )
            else:
                self.fs.write_text(
                    self.sentinel, f"GPU health remediation requested a reboot (request {request})\n"
                )
                self.sentinel_writes += 1
                self.log(
                    f"reboot requested ({request}): created {self.sentinel} for the reboot daemon (kured)"
                )
        except (HostPathError, OSError) as err:
            self.log(f"reboot requested ({request}): cannot create {self.sentinel}: {err} (trying again)")
            return False
        self.reboot = request
        return True

    # -- reset --

    def _wanted(self, gpus: tuple[str, ...], known: set[str]) -> list[str]:
        if [g.strip() for g in gpus] == ["all"]:
            return sorted(known)
        out = []
        for item in gpus:
            try:
                out.append(normalise_bus(item))
            except ValueError:
                self.log(f"reset requested: {item!r} is no PCI bus id; skipped")
        return sorted(set(out))

    def _reset(
        self, request: str, gpus: tuple[str, ...], known: set[str], gone: set[str], handled: Handled
    ) -> bool:
        """Reset what may be reset; True when every GPU asked for is reset."""
        if request != self.reset_request:
            self.reset_request, self.outcomes = request, {}
        wanted = self._wanted(gpus, known)
        todo = [b for b in wanted if not self.outcomes.get(b, "").startswith(FINAL)]
        if any(b in known and b not in gone for b in todo) and self.before_reset is not None:
            self.before_reset()  # NVML let go before the holders are read: its handles are open files
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
        return {
            bus: ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            for bus, names in out.items()
        }
