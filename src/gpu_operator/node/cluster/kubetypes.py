"""lightkube's msgspec types made ready in one thread, before a process decodes in several.

msgspec (0.22.0, CPython's GIL build) builds a Struct type's decoding info the first time the
type is decoded and sets it on the class before it has filled in the fields' entries. While it
fills them it runs Python code (it evaluates lightkube's string annotations), so the GIL can
pass to another thread; a second thread that decodes the same type in that window takes the
half-built info and reads an empty field entry: the process dies of SIGSEGV. lightkube decodes
with `msgspec.json.decode(data, type=...)`, so each of its types is first decoded by whichever
thread lists, gets or watches it first. Two threads that both list Pods for the first time crash
the process on nearly every try (tests/unit/node/cluster/test_kubetypes.py; docs/operator.md,
"Decoding from several threads").

`prepare()` does every such first decode here, in one thread under a lock: every lightkube
model, every resource and its list type. Once built, a type's info is never rebuilt, and
decoding from any number of threads is safe. A process calls it before it starts a thread that
decodes: the node agents' watches (node/cluster/kubeapi.py), the simulator's stand-ins (sim/standins/roster.py),
the test processes (tests/conftest.py). The operator decodes in its one event-loop thread, and
its own decoders (kube/pages.py, kube/nodewatch.py) are built when their modules are imported.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_ready = False
_EMPTY_LIST = b'{"items":[]}'


def prepare() -> bool:
    """Build the decoding info of every lightkube type in this thread, once per process.
    True if this call built them, False if an earlier call had."""
    global _ready
    with _lock:
        if _ready:
            return False
        import importlib
        import pkgutil

        import lightkube.models
        import lightkube.resources
        import msgspec
        from lightkube.core import decoders
        from lightkube.core.resource import Resource

        for package in (lightkube.models, lightkube.resources):
            for module in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{package.__name__}.{module.name}")
        for cls in _subclasses(msgspec.Struct):
            if cls.__module__.split(".")[0] == "lightkube":
                _built(msgspec.json.Decoder, cls)
        for cls in _subclasses(Resource):
            if issubclass(cls, msgspec.Struct):
                _built(decoders.decode_list, _EMPTY_LIST, cls)  # the resource's list type too
        _ready = True
        return True


def _built(build: Any, *args: Any) -> None:
    # A model msgspec refuses (lightkube-models 1.37.0.8's DeviceAttribute has a field named
    # `bool`, which shadows the type in its annotations) raises: no decode of it can succeed, so
    # there is no half-built info to race on either.
    with contextlib.suppress(TypeError, ValueError):
        build(*args)


def _subclasses(cls: type) -> Iterator[type]:
    seen: set[type] = set()
    todo: list[type] = list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        if sub not in seen:
            seen.add(sub)
            todo.extend(sub.__subclasses__())
            yield sub
