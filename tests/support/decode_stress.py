"""Decoding Kubernetes lists from several threads at once, run as its own process so that a crash
is an exit by signal (-11), not the end of the test run. tests/unit/node/cluster/test_kubetypes.py runs it.

    python -m tests.support.decode_stress [--no-prepare] [--threads N] [--items N] [--seconds S]
                                          [--switch-interval SECONDS] [--yield-in-gc] [--abort]

The lists hold kwok-shaped Pods and Nodes with their managedFields (tests/support/decode_shapes.py).
1. The first decodes: after `node.cluster.kubetypes.prepare()` (unless --no-prepare), N threads start at
   one barrier and each makes its process's first decode of a Pod list, a Node list or a watch
   event through lightkube's decoders (as a test and the stand-ins' pod watch do), then of six
   other kinds' lists.
2. For S seconds, N threads decode large lists (N items) through lightkube's decoders and the
   operator's own shared decoders (kube/pages.py, kube/nodewatch.py) and through decoders each
   thread builds, while one thread builds and drops decoders and new list types, and one collects
   garbage. Beside them:
   - an asyncio loop thread runs the operator's own read path against a mock transport (paged
     slim Pod lists through `pages.list_all`, a paged `NodeWatch.list`, `NodeWatch.handle_line`
     on watch events), and decodes in worker threads with `asyncio.to_thread` as the stand-ins do;
   - a thread decodes a Pod list from a bytearray and memoryviews of it while another one flips
     letters in it (the JSON stays valid) and tries to grow and shrink it.
   --yield-in-gc adds a gc callback that gives up the GIL: each collection a decode's allocations
   start lets the other threads run (and the mutator write) in the middle of that decode.
Every decode is checked (item count, a name, a label); exit 0 when all were right, 1 if one was
not. Prints one line of counts. --abort calls os.abort() after the first decodes: the proof that a
caller sees a crash (tests/unit/node/cluster/test_kubetypes.py).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import sys
import threading
import time
from typing import Any

from tests.support.decode_shapes import body, node, pod

__all__ = ["Stress", "body", "main", "node", "pod"]


class Stress:
    def __init__(self, threads: int, items: int, seconds: float) -> None:
        self.threads, self.items, self.seconds = threads, items, seconds
        self.pods = body("PodList", [pod(i) for i in range(items)])
        self.nodes = body("NodeList", [node(i) for i in range(items)])
        self.event = json.dumps({"type": "MODIFIED", "object": pod(7)}).encode()
        self.wrong: list[str] = []
        self.decodes = 0
        self.counts = {"gc_yields": 0, "resize_refused": 0, "resized": 0, "flips": 0, "torn": 0}
        self.count_lock = threading.Lock()

    def check(self, what: str, ok: bool) -> None:
        with self.count_lock:
            self.decodes += 1
            if not ok:
                self.wrong.append(what)

    def yield_in_gc(self) -> None:
        def switch(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                self.counts["gc_yields"] += 1
                time.sleep(0)  # releases the GIL

        gc.callbacks.append(switch)

    def first_decodes(self) -> None:
        from lightkube.core import decoders
        from lightkube.resources.apps_v1 import DaemonSet, Deployment
        from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Node, Pod, Secret

        barrier = threading.Barrier(self.threads)
        others = [Secret, ConfigMap, DaemonSet, Deployment, Event, Namespace]

        def one(k: int) -> None:
            barrier.wait()
            if k % 3 == 2:
                event = decoders.decode_watch_event(self.event)
                got = decoders.decode_object(event.object, Pod)
                self.check("watch event", got.metadata.name == "pod-7")
            else:
                kind, data = (Pod, self.pods) if k % 3 == 0 else (Node, self.nodes)
                _, rv, items = decoders.decode_list(data, kind)
                self.check(f"first {kind.__name__} list", rv == "9" and len(items) == self.items)
            for res in others[k % len(others) :] + others[: k % len(others)]:  # each type's whole tree
                _, rv, items = decoders.decode_list(b'{"metadata":{"resourceVersion":"3"},"items":[]}', res)
                self.check(f"first {res.__name__} list", rv == "3" and items == [])

        run_threads([threading.Thread(target=one, args=(k,)) for k in range(self.threads)])

    def loops(self) -> None:
        import msgspec
        from lightkube.core import decoders
        from lightkube.resources.core_v1 import Node, Pod

        from gpu_operator.kube import nodewatch, pages

        deadline = time.monotonic() + self.seconds
        last = f"node-{self.items - 1}"
        buffer = bytearray(self.pods)

        def decoder(k: int) -> None:
            own = msgspec.json.Decoder(pages._PodList)  # one per thread, beside the shared ones
            turn = k
            while time.monotonic() < deadline:
                turn += 1
                if turn % 4 == 0:
                    _, _, nodes = decoders.decode_list(self.nodes, Node)
                    self.check(
                        "lightkube Node list", len(nodes) == self.items and nodes[-1].metadata.name == last
                    )
                elif turn % 4 == 1:
                    _, _, pods = decoders.decode_list(self.pods, Pod)
                    self.check(
                        "lightkube Pod list",
                        len(pods) == self.items and pods[0].metadata.labels["app"] == "driver",
                    )
                elif turn % 4 == 2:
                    listed = nodewatch.DECODERS.list(self.nodes).items or []
                    self.check(
                        "operator Node list", len(listed) == self.items and listed[-1].metadata.name == last
                    )
                else:
                    slim = (pages._decode_pods if k % 2 else own.decode)(self.pods).items or []
                    self.check(
                        "operator Pod list", len(slim) == self.items and slim[0].metadata.name == "pod-0"
                    )

        def churn() -> None:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                item = msgspec.defstruct(f"Item{n}", [("metadata", dict), ("kind", str, "")])
                listed = msgspec.defstruct(f"Item{n}List", [("items", list[item])])  # type: ignore[valid-type]
                got: Any = msgspec.json.Decoder(listed).decode(self.nodes)
                self.check("new list type", len(got.items) == self.items)
                del item, listed, got

        def collect() -> None:
            while time.monotonic() < deadline:
                gc.collect()
                time.sleep(0.05)

        run_threads(
            [threading.Thread(target=decoder, args=(k,)) for k in range(self.threads)]
            + [threading.Thread(target=churn), threading.Thread(target=collect)]
            + [threading.Thread(target=asyncio.run, args=(self.event_loop(deadline),))]
            + [threading.Thread(target=f, args=(buffer, deadline)) for f in (self.from_buffer, self.mutate)]
        )

    def from_buffer(self, buffer: bytearray, deadline: float) -> None:
        """Pod lists decoded from `buffer` (which `mutate` writes to) and from memoryviews of it."""
        from lightkube.core import decoders
        from lightkube.resources.core_v1 import Pod

        from gpu_operator.kube import pages

        turn = 0
        while time.monotonic() < deadline:
            turn += 1
            if turn % 3 == 0:
                slim = pages._decode_pods(buffer).items or []
                labels = [p.metadata.labels for p in slim]
            else:
                with memoryview(buffer) as view:
                    source = view if turn % 3 == 1 else view[: len(view)]
                    full = decoders.decode_list(source, Pod)[2]  # type: ignore[arg-type]
                    del source
                labels = [p.metadata.labels for p in full]
            values = {(lb or {}).get("example.com/label-3") for lb in labels}
            self.check(
                "Pod list from a buffer", len(labels) == self.items and values <= {"value-3", "Value-3"}
            )
            if len(values) > 1:  # the mutator wrote while this decode read
                self.counts["torn"] += 1

    def mutate(self, buffer: bytearray, deadline: float) -> None:
        """Flips the case of the first letter of each pod's label-3 value in `buffer` (the JSON stays
        valid), and tries to add and drop a trailing space: refused (BufferError) while a decode
        holds the buffer."""
        letters = [m.start() + 1 for m in re.finditer(rb'"value-3"', buffer)]  # one label per pod
        while time.monotonic() < deadline:
            for at in letters:
                buffer[at] ^= 0x20  # v <-> V
            self.counts["flips"] += 1
            try:
                buffer.extend(b" ")
                self.counts["resized"] += 1
            except BufferError:
                self.counts["resize_refused"] += 1
            while buffer.endswith(b" "):
                try:
                    del buffer[-1]
                except BufferError:
                    self.counts["resize_refused"] += 1
                    break
            time.sleep(0)

    async def event_loop(self, deadline: float) -> None:
        """The operator's reads as its event loop makes them, on a mock apiserver: paged slim Pod
        lists, a paged Node list into a NodeWatch and watch events into it; and lightkube decodes
        in worker threads (asyncio.to_thread), as the stand-ins' server does."""
        import httpx2
        from lightkube.core import decoders
        from lightkube.resources.core_v1 import Node

        from gpu_operator.kube import nodewatch, pages

        half = self.items // 2
        pods, nodes = [pod(i) for i in range(self.items)], [node(i) for i in range(self.items)]
        served = {
            ("/api/v1/pods", ""): body("PodList", pods[:half], cont="more"),
            ("/api/v1/pods", "more"): body("PodList", pods[half:]),
            (nodewatch.NODES_PATH, ""): body("NodeList", nodes[:half], cont="more"),
            (nodewatch.NODES_PATH, "more"): body("NodeList", nodes[half:]),
        }
        del pods, nodes

        def answer(request: httpx2.Request) -> httpx2.Response:
            key = (request.url.path, request.url.params.get("continue", ""))
            return httpx2.Response(200, content=served[key])

        events = [
            json.dumps({"type": "MODIFIED", "object": node(i)}).encode() for i in range(0, self.items, 37)
        ]
        changed: list[str] = []
        async with httpx2.AsyncClient(
            transport=httpx2.MockTransport(answer), base_url="https://apiserver"
        ) as http:
            # no line streams: list() and handle_line() only
            watch: nodewatch.NodeWatch[int] = nodewatch.NodeWatch(
                http,
                None,  # type: ignore[arg-type]
                lambda name, view: changed.append(name),
                lambda n: len(n.metadata.labels or {}),
                delay=lambda n: 1.0,
            )
            while time.monotonic() < deadline:
                listed = await pages.list_all(http, "/api/v1/pods", slim_pods=True)
                self.check(
                    "operator paged Pod list",
                    len(listed) == self.items and listed[-1]["spec"]["nodeName"] == f"node-{self.items - 1}",
                )
                await watch.list()
                self.check(
                    "operator paged Node list", len(watch.views) == self.items and watch.views["node-0"] == 48
                )
                for line in events:
                    watch.handle_line(line)
                self.check("operator watch events", len(watch.views) == self.items)
                side = await asyncio.to_thread(decoders.decode_list, self.nodes, Node)
                self.check("lightkube Node list in a worker thread", len(side[2]) == self.items)


def run_threads(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-prepare", action="store_true", help="skip node.cluster.kubetypes.prepare()")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--switch-interval", type=float, help="sys.setswitchinterval: pass the GIL more often"
    )
    parser.add_argument(
        "--yield-in-gc", action="store_true", help="give up the GIL at each collection's start"
    )
    parser.add_argument("--abort", action="store_true", help="os.abort() after the first decodes")
    args = parser.parse_args(argv)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    stress = Stress(args.threads, args.items, args.seconds)
    if args.yield_in_gc:
        stress.yield_in_gc()
    if not args.no_prepare:
        from gpu_operator.node.cluster import kubetypes

        kubetypes.prepare()
    started = time.monotonic()
    stress.first_decodes()
    if args.abort:
        os.abort()
    stress.loops()
    print(
        json.dumps(
            {
                "decodes": stress.decodes,
                "wrong": len(stress.wrong),
                "threads": args.threads,
                "items": args.items,
                "seconds": round(time.monotonic() - started, 1),
                **stress.counts,
            }
        )
    )
    if stress.wrong:
        print("wrong:", sorted(set(stress.wrong)), file=sys.stderr)
    return 1 if stress.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
