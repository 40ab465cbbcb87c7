"""Which kernel-log records are the NVIDIA driver's own Xid lines, and which only look like one.

Anything on the node can get text into the kernel log: the kernel logs an unhandled fault with the
faulting process's name and the file it was in (`comm[pid]: segfault at ... in <file name>[...]`),
and a process allowed to write /dev/kmsg adds records of its own (facility user, or any it names but
kern). So a record counts as an Xid only when all of these hold:

1. its header says facility kern (0): the kernel's own printk, as the driver's NVRM lines are;
2. its message BEGINS with the driver's `NVRM: Xid (` and parses as the driver prints it
   (catalogue.XID_LINE: `NVRM: Xid (PCI:0000:3b:00): 79, ...`, MIG attribution included);
3. its address (domain:bus:device) is one of this node's GPUs (the PCI bus, the driver's /proc
   entries, NVML), the function the GPU's own;
4. NVML does not already watch that GPU's Xid events: where NVML loads and took the GPU's Xid
   registration, its events are the channel and the kernel log the fallback.

Every other record that mentions `NVRM: Xid` is dropped, counted by reason (the five below;
the agent's metric gpu_operator_gpu_xid_lines_ignored_total{reason}) and logged (the first of each
reason, then every LOG_EVERY-th), never a fault.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from gpu_operator.node.health.catalogue import XID_LINE, XID_PREFIX
from gpu_operator.node.health.kmsg import KERN, KmsgRecord, XidEvent
from gpu_operator.node.host.pci import normalise_bus

MENTION = "NVRM: Xid"
NOT_KERNEL = "not-kernel"  # the record's facility is not kern (a process wrote it), or it has no header
NOT_AT_START = "not-at-start"  # the text is inside another message (a segfault line's file name, ...)
UNPARSED = "unparsed"  # begins with the prefix but is not the driver's format
NOT_A_GPU = "not-a-gpu"  # names an address that is none of this node's GPUs
NVML_WATCHES = "nvml-watches"  # a true driver line for a GPU whose Xid events NVML delivers
LOG_EVERY = 100


def slot(bus: str) -> str:
    """domain:bus:device of a PCI address, as the driver's Xid line names a GPU."""
    return normalise_bus(bus).rsplit(".", 1)[0]


def judge(
    record: KmsgRecord, gpus: Iterable[str], nvml_watched: Iterable[str] = ()
) -> tuple[XidEvent | None, str]:
    """(event, "") for the driver's own Xid line naming one of `gpus` (normalised bus ids);
    (None, reason) for a record that mentions an Xid but does not count; (None, "") otherwise."""
    message = record.message
    if MENTION not in message:
        return None, ""
    if record.facility != KERN:
        return None, NOT_KERNEL
    if not message.startswith(XID_PREFIX):
        return None, NOT_AT_START
    match = XID_LINE.match(message)
    if match is None:
        return None, UNPARSED
    named = match.group(1).lower()
    want = normalise_bus(named)
    known = set(gpus)
    # the driver names domain:bus:device; an address with a function must be the GPU's exactly
    matches = sorted(g for g in known if (g == want if "." in named else slot(g) == slot(want)))
    if not matches:
        return None, NOT_A_GPU
    bus = matches[0]  # the GPU's function (x.0); its audio function is no GPU of ours
    if bus in set(nvml_watched):
        return None, NVML_WATCHES
    return XidEvent(bus, int(match.group(2)), message.strip()[:300], "kmsg"), ""


class KernelXids:
    """The kernel log's Xid events of one agent, with the count of records dropped per reason."""

    def __init__(self, log: Callable[[str], None], on_ignored: Callable[[str], None] | None = None) -> None:
        self.log = log
        self.on_ignored = on_ignored
        self.ignored: Counter[str] = Counter()

    def take(
        self, records: Iterable[KmsgRecord], gpus: Iterable[str], nvml_watched: Iterable[str] = ()
    ) -> list[XidEvent]:
        known, watched = set(gpus), set(nvml_watched)
        out = []
        for record in records:
            event, reason = judge(record, known, watched)
            if event is not None:
                out.append(event)
            elif reason:
                self.ignored[reason] += 1
                if self.on_ignored is not None:
                    self.on_ignored(reason)
                count = self.ignored[reason]
                if count == 1 or count % LOG_EVERY == 0:
                    self.log(
                        f"kernel log: a record naming an Xid that is not the driver's for a GPU of this "
                        f"node ({reason}, {count} so far), not counted: {record.message[:200]!r}"
                    )
        return out
