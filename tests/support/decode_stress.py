"""Decoding Kubernetes lists from several threads at once, run as its own process so that a crash
is an exit by signal (-11), not the end of the test run. tests/unit/node/test_kubetypes.py runs it.

    python -m tests.support.decode_stress [--no-prepare] [--threads N] [--items N] [--seconds S]
                                          [--switch-interval SECONDS]

1. The first decodes: after `node.kubetypes.prepare()` (unless --no-prepare), N threads start at
   one barrier and each makes its process's first decode of a Pod list, a Node list or a watch
   event through lightkube's decoders (as a test and the stand-ins' pod watch do), then of six
   other kinds' lists.
2. For S seconds, N threads decode large lists (N items: Pods with their owner, containers and
   status; Nodes with 40 labels) through lightkube's decoders and the operator's own shared
   decoders (kube/pages.py, kube/nodewatch.py) and through decoders each thread builds, while one
   thread builds and drops decoders and new list types, and one collects garbage.
Every decode is checked (item count, a name, a label); exit 0 when all were right, 1 if one was
not. Prints one line of counts.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
from typing import Any


def pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"pod-{i}",
            "namespace": "gpu-operator",
            "uid": f"uid-{i}",
            "resourceVersion": str(1000 + i),
            "labels": {**{f"example.com/label-{j}": f"value-{j}" for j in range(10)}, "app": "driver"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": "nvidia-driver",
                    "uid": "ds-uid",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": f"node-{i}",
            "serviceAccountName": "driver",
            "containers": [
                {
                    "name": "driver",
                    "image": "nvcr.io/nvidia/driver:595.45.04",
                    "env": [{"name": f"E{j}", "value": str(j)} for j in range(5)],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
            "tolerations": [{"operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
                                ]
                            }
                        ]
                    }
                }
            },
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "driver",
                    "ready": True,
                    "restartCount": 0,
                    "image": "driver",
                    "imageID": "sha256:0",
                    "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}},
                }
            ],
        },
    }


def node(i: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"node-{i}",
            "uid": f"node-uid-{i}",
            "resourceVersion": str(5000 + i),
            "labels": {f"nvidia.com/gpu.label-{j}": f"value-{j}" for j in range(40)},
            "annotations": {"example.com/note": "x" * 64},
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "8", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "8"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": "2026-12-01T00:00:00Z",
                }
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.37.2",
                "architecture": "amd64",
                "bootID": "b",
                "containerRuntimeVersion": "containerd://2.1",
                "kernelVersion": "6.8",
                "kubeProxyVersion": "",
                "machineID": "m",
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04",
                "systemUUID": "s",
            },
        },
    }


def body(kind: str, items: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "9"}, "items": items}
    ).encode()


class Stress:
    def __init__(self, threads: int, items: int, seconds: float) -> None:
        self.threads, self.items, self.seconds = threads, items, seconds
        self.pods = body("PodList", [pod(i) for i in range(items)])
        self.nodes = body("NodeList", [node(i) for i in range(items)])
        self.event = json.dumps({"type": "MODIFIED", "object": pod(7)}).encode()
        self.wrong: list[str] = []
        self.decodes = 0
        self.count_lock = threading.Lock()

    def check(self, what: str, ok: bool) -> None:
        with self.count_lock:
            self.decodes += 1
            if not ok:
                self.wrong.append(what)

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
                    listed = nodewatch._decode_list(self.nodes).items or []
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
        )


def run_threads(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-prepare", action="store_true", help="skip node.kubetypes.prepare()")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--switch-interval", type=float, help="sys.setswitchinterval: pass the GIL more often"
    )
    args = parser.parse_args(argv)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    stress = Stress(args.threads, args.items, args.seconds)
    if not args.no_prepare:
        from gpu_operator.node import kubetypes

        kubetypes.prepare()
    started = time.monotonic()
    stress.first_decodes()
    stress.loops()
    print(
        json.dumps(
            {
                "decodes": stress.decodes,
                "wrong": len(stress.wrong),
                "threads": args.threads,
                "items": args.items,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
    if stress.wrong:
        print("wrong:", sorted(set(stress.wrong)), file=sys.stderr)
    return 1 if stress.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
