"""What one Node watch event costs the operator's process, by HTTP path: the shared HTTP client's
stream iterators (what the Node watch used before) against kube/linestream.py (what it uses now),
each feeding the Node watch's decoder (kube/nodewatch.py) with kwok-like heartbeats over TLS.

A server process on 127.0.0.1 (the simulator's PKI) sends N MODIFIED events of one node, each
its own chunk, `--gap` seconds apart so each arrives on its own read as heartbeats do; the figure
is the client process's CPU (user + system) per event. Run:
    .venv/bin/python bench/watchstream.py --events 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
from lightkube import KubeConfig

from gpu_operator.controllers.reflector import NodeReflector
from gpu_operator.kube.linestream import LineStreams
from gpu_operator.shapes import nodes as shape_nodes
from gpu_operator.sim.plane import pki as simpki
from gpu_operator.sim.plane.kubeconfig import write_kubeconfig


def heartbeat_node() -> dict[str, Any]:
    """A labelled dgx-h100 node as kwok reports it: status, the operator's labels, managedFields."""
    node = shape_nodes(["dgx-h100"])[0]
    node["metadata"]["labels"].update({f"nvidia.com/gpu.deploy.operand-{i}": "true" for i in range(12)})
    node["metadata"]["managedFields"] = [
        {
            "manager": m,
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-11-26T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in node["metadata"]["labels"]}}},
        }
        for m in ("kwok", "gpu-operator")
    ]
    node["status"] = {
        "conditions": [
            {
                "type": t,
                "status": "False" if t != "Ready" else "True",
                "reason": "KubeletReady",
                "message": "kwok",
                "lastHeartbeatTime": "2026-11-26T10:00:00Z",
                "lastTransitionTime": "2026-11-26T09:00:00Z",
            }
            for t in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
        ],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n"}],
        "capacity": {"cpu": "224", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": "8"},
        "allocatable": {"cpu": "224", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": "8"},
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "kernelVersion": "6.8.0-45-generic",
            "containerRuntimeVersion": "containerd://2.1.4",
            "kubeletVersion": "v1.36.3",
            "osImage": "Ubuntu 24.04.1 LTS",
            "architecture": "amd64",
            "operatingSystem": "linux",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
        "phase": "Running",
    }
    return node


def serve(directory: str, port_out: Any, events: int, gap: float) -> None:
    pki = simpki.Pki(Path(directory))
    node = heartbeat_node()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for i in range(events):
            node["metadata"]["resourceVersion"] = str(1000 + i)
            node["status"]["conditions"][0]["lastHeartbeatTime"] = (
                f"2026-11-26T10:{i // 60 % 60:02d}:{i % 60:02d}Z"
            )
            body = json.dumps({"type": "MODIFIED", "object": node}, separators=(",", ":")).encode() + b"\n"
            writer.write(b"%x\r\n%s\r\n" % (len(body), body))
            await writer.drain()
            await asyncio.sleep(gap)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main() -> None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
        port_out.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


async def measure(path: str, url: str, ca: Path) -> tuple[float, int]:
    config = KubeConfig.from_file(
        write_kubeconfig(ca.parent / "kubeconfig", server=url, ca=ca, user="bench", token="bench")
    ).get()
    assert config is not None
    streams = LineStreams(config)
    http = httpx2.AsyncClient(base_url=url, verify=ssl.create_default_context(cafile=str(ca)))
    watch = NodeReflector(http, streams, lambda name, view: None)
    count = 0

    def on_line(line: bytes) -> None:
        nonlocal count
        count += 1
        watch.handle_line(line)

    started = time.process_time()
    if path == "linestream":
        await streams.stream("/api/v1/nodes", {"watch": "true"}, on_line, connect_timeout=10, timeout=600)
    else:
        async with http.stream("GET", "/api/v1/nodes", params={"watch": "true"}, timeout=600) as response:
            async for line in response.aiter_lines():
                if line:
                    on_line(line.encode())
    cpu = time.process_time() - started
    await http.aclose()
    return cpu, count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--gap", type=float, default=0.002, help="seconds between two events")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        pki = simpki.generate(Path(directory))
        ports: Any = multiprocessing.Queue()
        server = multiprocessing.Process(
            target=serve, args=(directory, ports, args.events, args.gap), daemon=True
        )
        server.start()
        url = f"https://127.0.0.1:{ports.get(timeout=30)}"
        size = len(json.dumps({"type": "MODIFIED", "object": heartbeat_node()}, separators=(",", ":")))
        print(
            f"{args.events} heartbeat events of {size} bytes, {args.gap * 1000:.0f} ms apart, {args.rounds} rounds"
        )
        figures: dict[str, list[float]] = {"http client stream": [], "linestream": []}
        for _ in range(args.rounds):
            for path in figures:
                cpu, count = asyncio.run(measure(path, url, pki.ca_cert))
                if count != args.events:
                    sys.exit(f"{path}: {count} of {args.events} events arrived")
                figures[path].append(cpu / count * 1e6)
        server.terminate()
    for path, values in figures.items():
        print(
            f"{path:>20}: CPU per event median {statistics.median(values):.0f} us "
            f"(rounds: {', '.join(f'{v:.0f}' for v in values)})"
        )


if __name__ == "__main__":
    main()
