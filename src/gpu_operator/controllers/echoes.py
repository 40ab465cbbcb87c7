"""Our own status writes come back as watch events: those echoes start no pass.

Every pass ends by writing the CR's status when it changed; the write comes back as a MODIFIED
event, and each such event asked every loop for one more pass (a render of the whole policy, an
upgrade pass over every node): about three a second while nodes joined during a rollout (the
DaemonSets' own events asked for as many then, so the pass count hardly moved; an operator whose
only news is its own write no longer answers itself). Upstream filters its CRs' events the same
way (controller-runtime's GenerationChangedPredicate); here the filter is narrower: an event
starts no pass only when the object, its status aside, is what the last event showed and its
status holds what we last wrote. Anything else (a spec, label or annotation change, a status
someone else wrote, ADDED, DELETED) kicks as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

DROPPED = ("resourceVersion", "managedFields")


def _without_status(body: Mapping[str, Any]) -> str:
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k not in DROPPED}
    return json.dumps(
        {**{k: v for k, v in body.items() if k not in ("status", "metadata")}, "metadata": meta},
        sort_keys=True,
        default=str,
    )


class StatusEchoes:
    """Tells a watch event of one CR kind that only echoes our own status write."""

    def __init__(self, written: Callable[[str], Mapping[str, Any] | None]) -> None:
        self.written = written  # name -> the status fields we last sent this kind's object, or None
        self._seen: dict[str, str] = {}  # uid -> the object as last seen, status aside

    def is_echo(self, body: Mapping[str, Any], event_type: str | None) -> bool:
        meta = body.get("metadata") or {}
        uid, name = str(meta.get("uid", "")), str(meta.get("name", ""))
        if event_type == "DELETED":
            self._seen.pop(uid, None)
            return False
        shape, before = _without_status(body), self._seen.get(uid)
        self._seen[uid] = shape
        if event_type != "MODIFIED" or before != shape:
            return False
        sent = self.written(name)
        status = body.get("status") or {}
        return sent is not None and all(status.get(key) == value for key, value in sent.items())
