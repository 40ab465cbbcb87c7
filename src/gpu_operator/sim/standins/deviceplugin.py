"""A stand-in for NVIDIA's device plugin on the real node (simulator code, not an operand: NVIDIA's
image cannot be pulled here), run only inside a device plugin's pod: the image the simulator
imports under NVIDIA's name runs it (`pluginimage`), so it lives and dies with its pod. It
speaks the kubelet's device-plugin API (`dpapi`) for `nvidia.com/gpu` and answers as NVIDIA's
plugin does (NVIDIA/k8s-device-plugin internal/plugin/server.go; facts only):

- registers its socket `nvidia-gpu.sock` with the kubelet (version v1beta1, preferred allocation
  available), again whenever the kubelet's socket is re-created (a kubelet restart removes plugin
  sockets);
- ListAndWatch: one device per GPU of the host tree (ID = its UUID, DEVICE_ID_STRATEGY=uuid, the
  default; NUMA node from sysfs), Unhealthy once the tree's kernel log has a critical Xid for it
  after the plugin started (NVIDIA's rule, see `xidhealth`: NVML's Xid events, the application
  Xids and DP_DISABLE_HEALTHCHECKS/DP_ENABLE_HEALTHCHECKS ignored) until a new boot, and while its
  /dev/nvidiaN is gone (the GPU fell off the bus, `sim fault --gone`: NVIDIA's plugin gets Xid 79
  and NVML fails for it); a new list is sent on every change;
- Allocate, by DEVICE_LIST_STRATEGY: `envvar` (default) sets NVIDIA_VISIBLE_DEVICES to the
  allocated IDs; `cdi-annotations` sets the annotation `cdi.k8s.io/nvidia-device-plugin_<id>` to
  `k8s.device-plugin.nvidia.com/gpu=<ID>,...` and writes that kind's CDI spec into the tree's
  /var/run/cdi, as NVIDIA's plugin does; an unknown ID fails the call;
- GetPreferredAllocation: the must-include IDs, then the others in PCI order;
- MIG (`--mig-strategy`, MIG_STRATEGY; the tree's MIG state, `migtree`): the resources and device IDs
  of `migresources` (single: the MIG devices as `nvidia.com/gpu`; mixed: one server and socket per
  resource, `nvidia-mig-<profile>.sock`, as internal/plugin/server.go names them
  `nvidia-<resource name>.sock`); a MIG device's ID is its MIG UUID, its health its parent GPU's,
  Allocate hands out the MIG UUIDs (envvar) or their CDI names, whose spec entry has the parent
  GPU's node and the MIG device's cap nodes.
- Sharing (`--config-file`, CONFIG_FILE: the file NVIDIA's config-manager links; `sim/standins/sharing.py`):
  each device of a time-sliced or MPS resource is `replicas` devices `<ID>::<i>` of the resource
  (or `<resource>.shared` with renameByDefault), so the kubelet's capacity is GPUs x replicas;
  Allocate strips `::<i>` and hands out each device once (server.go
  `uniqueDeviceIDsFromAnnotatedDeviceIDs`), refuses more than one replica per request with
  failRequestsGreaterThanOne (rm.go `ValidateRequest`); SIGHUP (config-manager's signal) stops
  the servers and starts them again with the file read afresh (cmd/nvidia-device-plugin/main.go).
  Not played: MPS's control daemon, the replica-spreading preferred allocation.

The `nvidia` runtime handler (`nvruntime`) then does the rest, as the toolkit would.
Run: `python -m gpu_operator.sim.standins.deviceplugin --host-root TREE --plugin-dir DIR [--strategy S]`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpu_operator.sim.hardware import devnodes, migtree
from gpu_operator.sim.realnode.toolkit import VISIBLE, Gpu, gpus
from gpu_operator.sim.standins import dpapi, migresources, sharing
from gpu_operator.sim.standins.xidhealth import XidHealth
from gpu_operator.vocabulary import GPU_RESOURCE

RESOURCE = GPU_RESOURCE
SOCKET = "nvidia-gpu.sock"
STRATEGIES = ("envvar", "cdi-annotations")
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
CDI_SPEC = "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"
CDI_ANNOTATION = "cdi.k8s.io/nvidia-device-plugin_"
POLL_SECONDS = 1.0
Empty = dpapi.message("Empty")


class GpuPlugin:
    """The DevicePlugin service over one host tree."""

    def __init__(
        self,
        host_root: Path,
        strategy: str = "envvar",
        env: dict[str, str] | None = None,
        resource: str = RESOURCE,
        mig_strategy: str = "none",
        config: sharing.Sharing | None = None,
        cdi_root: Path | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"--strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
        if mig_strategy not in migresources.STRATEGIES:
            raise ValueError(
                f"--mig-strategy {mig_strategy!r}: use one of {', '.join(migresources.STRATEGIES)}"
            )
        self.host_root, self.strategy = host_root, strategy
        # where the CDI spec goes: the host tree's /var/run/cdi, or (in the plugin's pod, whose host
        # tree is read-only) the pod's /var/run/cdi, the node's
        self.cdi_root = host_root if cdi_root is None else cdi_root
        self.resource, self.mig_strategy = resource, mig_strategy
        self.config = config or sharing.Sharing()
        self.socket = f"nvidia-{resource.removeprefix('nvidia.com/')}.sock"
        self.stopping = threading.Event()
        self.xids = XidHealth(host_root, dict(os.environ) if env is None else env)
        self._found: tuple[str, list[Gpu]] | None = None

    def gpus(self) -> list[Gpu]:
        """The GPUs the plugin found at its start, as NVIDIA's plugin keeps them: one that falls off
        the bus stays listed (Unhealthy). A new boot is a new plugin process: found again."""
        boot = self.xids.boot_id()
        if self._found is None or (self._found[0] and self._found[0] != boot):
            self._found = (boot, gpus(self.host_root))
        elif not self._found[0]:  # the tree got its boot_id: the same boot
            self._found = (boot, self._found[1])
        return self._found[1]

    def _numa(self, gpu: Gpu) -> int | None:
        path = self.host_root / "sys/bus/pci/devices" / gpu.address / "numa_node"
        text = path.read_text().strip() if path.is_file() else ""
        return int(text) if text.lstrip("-").isdigit() and int(text) >= 0 else None

    def advertised(self) -> list[tuple[str, Gpu]]:
        """(device ID, its GPU) of this plugin's resource: the GPUs, or with MIG the MIG devices
        its strategy gives the resource (PluginError where the strategy refuses the layout)."""
        by_index = {g.index: g for g in self.gpus()}
        listed = resources_of(self.host_root, self.mig_strategy, self.config, by_index)
        return [(i, by_index[parent]) for i, parent in listed.get(self.resource, [])]

    def devices(self) -> list[Any]:
        out = []
        xid_marked = self.xids.poll()
        for device_id, gpu in self.advertised():
            healthy = (
                devnodes.char_device(self.host_root / f"dev/nvidia{gpu.minor}") is not None
                and gpu.address.rsplit(".", 1)[0] not in xid_marked
            )
            device = dpapi.message("Device")(
                ID=device_id, health=dpapi.HEALTHY if healthy else dpapi.UNHEALTHY
            )
            numa = self._numa(gpu)
            if numa is not None:
                device.topology.nodes.add(ID=numa)
            out.append(device)
        return out

    # -- the DevicePlugin service --

    def options(self, request: Any, context: Any) -> Any:
        return dpapi.message("DevicePluginOptions")(get_preferred_allocation_available=True)

    def list_and_watch(self, request: Any, context: Any) -> Iterator[Any]:
        last = None
        while not self.stopping.is_set() and context.is_active():
            devices = self.devices()
            shown = [(d.ID, d.health) for d in devices]
            if shown != last:
                last = shown
                yield dpapi.message("ListAndWatchResponse")(devices=devices)
            self.stopping.wait(POLL_SECONDS)

    def preferred(self, request: Any, context: Any) -> Any:
        response = dpapi.message("PreferredAllocationResponse")()
        order = [i for i, _ in self.advertised()]
        for req in request.container_requests:
            chosen = list(req.must_include_deviceIDs)
            chosen += [i for i in order if i in req.available_deviceIDs and i not in chosen]
            response.container_responses.add(deviceIDs=chosen[: req.allocation_size])
        return response

    def allocate(self, request: Any, context: Any) -> Any:
        known = {i for i, _ in self.advertised()}
        response = dpapi.message("AllocateResponse")()
        for req in request.container_requests:
            ids = list(dict.fromkeys(req.devices_ids))
            unknown = [i for i in ids if i not in known]
            if unknown:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"invalid allocation request for {self.resource!r}: unknown device: {', '.join(unknown)}",
                )
            refused = sharing.too_many(self.config, ids)
            if refused:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"invalid allocation request for {self.resource!r}: {refused}",
                )
            ids = list(dict.fromkeys(sharing.device_id(i) for i in ids))
            out = response.container_responses.add()
            if self.strategy == "envvar":
                out.envs[VISIBLE] = ",".join(ids)
            else:
                self.write_cdi_spec()
                out.annotations[f"{CDI_ANNOTATION}{uuid.uuid4()}"] = ",".join(f"{CDI_KIND}={i}" for i in ids)
        return response

    def pre_start(self, request: Any, context: Any) -> Any:
        return dpapi.message("PreStartContainerResponse")()

    def write_cdi_spec(self) -> None:
        """The plugin's CDI spec: each GPU by ID (its device node), the control devices for all."""
        common = [
            f"/dev/{n}"
            for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
            if devnodes.char_device(self.host_root / "dev" / n) is not None
        ]
        devices = []
        for device_id, g in dict((sharing.device_id(i), g) for i, g in self.advertised()).items():
            nodes = [f"/dev/nvidia{g.minor}"]
            mig = migtree.mig_device(self.host_root, device_id) if device_id.startswith("MIG-") else None
            if mig is not None:
                nodes += [path for path, _ in migtree.access_nodes(g.minor, mig[1])]
            devices.append(
                {"name": device_id, "containerEdits": {"deviceNodes": [{"path": p} for p in nodes]}}
            )
        spec = {
            "cdiVersion": "0.5.0",
            "kind": CDI_KIND,
            "devices": devices,
            "containerEdits": {"deviceNodes": [{"path": p} for p in common]},
        }
        target = self.cdi_root / CDI_SPEC.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(spec, indent=2))

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Any, req: str, resp: str) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=dpapi.message(req).FromString,
                response_serializer=dpapi.message(resp).SerializeToString,
            )

        return grpc.method_handlers_generic_handler(
            dpapi.PLUGIN_SERVICE,
            {
                "GetDevicePluginOptions": unary(self.options, "Empty", "DevicePluginOptions"),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                    self.list_and_watch,
                    request_deserializer=Empty.FromString,
                    response_serializer=dpapi.message("ListAndWatchResponse").SerializeToString,
                ),
                "GetPreferredAllocation": unary(
                    self.preferred, "PreferredAllocationRequest", "PreferredAllocationResponse"
                ),
                "Allocate": unary(self.allocate, "AllocateRequest", "AllocateResponse"),
                "PreStartContainer": unary(
                    self.pre_start, "PreStartContainerRequest", "PreStartContainerResponse"
                ),
            },
        )


def register(
    kubelet_socket: Path, endpoint: str = SOCKET, timeout: float = 5.0, resource: str = RESOURCE
) -> None:
    """Register our socket's name with the kubelet, as NVIDIA's plugin does."""
    request = dpapi.message("RegisterRequest")(
        version=dpapi.VERSION,
        endpoint=endpoint,
        resource_name=resource,
        options=dpapi.message("DevicePluginOptions")(get_preferred_allocation_available=True),
    )
    with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
        call = channel.unary_unary(
            dpapi.REGISTER,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=Empty.FromString,
        )
        call(request, timeout=timeout)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def serve(plugin: GpuPlugin, plugin_dir: Path, log: Any = print) -> None:
    """Serve and stay registered until `plugin.stopping` is set: a new kubelet socket, or our own
    socket removed (a kubelet restart clears the directory), starts the server again and registers."""
    kubelet_socket = plugin_dir / dpapi.KUBELET_SOCKET
    server: grpc.Server | None = None
    registered: tuple[int | None, int | None] = (None, None)
    waiting_said = False
    while not plugin.stopping.is_set():
        ours = plugin_dir / plugin.socket
        state = (_inode(kubelet_socket), _inode(ours))
        if state[0] is None and not waiting_said:
            log(f"device plugin: waiting for the kubelet's socket {kubelet_socket}")
            waiting_said = True
        if state[0] is not None and (state != registered or server is None):
            if server is not None:
                server.stop(grace=None)
            ours.unlink(missing_ok=True)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            server.add_generic_rpc_handlers((plugin.handler(),))
            server.add_insecure_port(f"unix://{ours}")
            server.start()
            try:
                register(kubelet_socket, plugin.socket, resource=plugin.resource)
            except grpc.RpcError as err:
                log(f"device plugin: registering with {kubelet_socket} failed ({err.code().name}); retrying")
                time.sleep(POLL_SECONDS)
                continue
            registered = (_inode(kubelet_socket), _inode(ours))
            waiting_said = False
            log(
                f"device plugin: {plugin.resource} registered ({len(plugin.advertised())} devices, "
                f"strategy {plugin.strategy})"
            )
        plugin.stopping.wait(POLL_SECONDS)
    if server is not None:
        server.stop(grace=1.0)
    (plugin_dir / plugin.socket).unlink(missing_ok=True)


def load_config(path: str) -> sharing.Sharing:
    """The plugin's config file (none given: the default config; an empty file, config-manager's
    /dev/null link, too); SharingConfigError where NVIDIA's plugin would not start."""
    if not path:
        return sharing.Sharing()
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise sharing.SharingConfigError(f"--config-file {path}: unable to parse config file: {err}") from err
    return sharing.parse(text, path)


def env_strategy(value: str) -> str:
    """DEVICE_LIST_STRATEGY (NVIDIA's: a comma-separated list, e.g. the operator's
    `cdi-annotations,cdi-cri` with CDI on) as the stand-in plays it: the first strategy it knows
    (`cdi-cri`, the CRI's CDI devices field, is not played: the annotations reach the runtime)."""
    given = [s.strip() for s in value.split(",") if s.strip()]
    for strategy in given:
        if strategy in STRATEGIES:
            return strategy
    if not given:
        return "envvar"
    raise ValueError(f"DEVICE_LIST_STRATEGY={value!r}: the stand-in plays {', '.join(STRATEGIES)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_operator.sim.standins.deviceplugin", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host-root", type=Path, required=True, help="the node's host tree")
    parser.add_argument(
        "--plugin-dir", type=Path, required=True, help="the kubelet's device-plugins directory"
    )
    parser.add_argument(
        "--strategy",
        default=None,
        choices=STRATEGIES,
        help="default: DEVICE_LIST_STRATEGY's first known strategy, else envvar",
    )
    parser.add_argument(
        "--cdi-root", type=Path, default=None, help="where /var/run/cdi is (default: the host tree's)"
    )
    parser.add_argument(
        "--mig-strategy",
        default=os.environ.get("MIG_STRATEGY") or "",
        choices=("", *migresources.STRATEGIES),
        help="MIG_STRATEGY (default: the config's, else none)",
    )
    parser.add_argument(
        "--config-file",
        default=os.environ.get("CONFIG_FILE") or "",
        help="CONFIG_FILE: the plugin config (sharing), read at start and on SIGHUP",
    )
    args = parser.parse_args(argv)
    try:
        strategy = args.strategy or env_strategy(os.environ.get("DEVICE_LIST_STRATEGY", ""))
    except ValueError as err:
        raise SystemExit(f"device plugin: {err}") from err
    stop, restart = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: restart.set())
    while not stop.is_set():
        try:
            config = load_config(args.config_file)
            mig_strategy = args.mig_strategy or config.mig_strategy or "none"
            sharing.check(config, mig_strategy)
            plugins = plugins_for(args.host_root, strategy, mig_strategy, config, args.cdi_root)
        except (migresources.PluginError, sharing.SharingConfigError) as err:
            raise SystemExit(f"device plugin: {err}") from err
        threads = [
            threading.Thread(target=serve, args=(p, args.plugin_dir, lambda msg: print(msg, flush=True)))
            for p in plugins
        ]
        for t in threads:
            t.start()
        while not (stop.is_set() or restart.is_set()):
            stop.wait(POLL_SECONDS / 4)
        if restart.is_set():
            print("device plugin: received SIGHUP, restarting", flush=True)
        restart.clear()
        for p in plugins:
            p.stopping.set()
        for t in threads:
            t.join()


def resources_of(
    host_root: Path, mig_strategy: str, config: sharing.Sharing, by_index: dict[int, Gpu] | None = None
) -> dict[str, list[tuple[str, int]]]:
    """Resource -> (device ID, parent GPU index) the plugin serves: its GPUs (`by_index`: those it
    found), or their MIG devices by its strategy, with the config's replicas."""
    if by_index is None:
        by_index = {g.index: g for g in gpus(host_root)}
    state = migtree.tree_state(host_root) if mig_strategy != "none" else None
    if state is None:
        listed = {RESOURCE: [(g.uuid, g.index) for g in by_index.values()]} if by_index else {}
    else:
        listed = migresources.advertised(mig_strategy, [m for m in state if m.index in by_index])
    return sharing.replicate(config, listed)


def plugins_for(
    host_root: Path,
    strategy: str,
    mig_strategy: str,
    config: sharing.Sharing | None = None,
    cdi_root: Path | None = None,
) -> list[GpuPlugin]:
    """One plugin per resource the GPUs give at start, as NVIDIA's plugin builds its servers (none
    when the strategy refuses the MIG layout: NVIDIA's exits)."""
    config = config or sharing.Sharing()
    names = resources_of(host_root, mig_strategy, config)
    if not names:
        return [GpuPlugin(host_root, strategy, config=config, cdi_root=cdi_root)]
    return [
        GpuPlugin(
            host_root, strategy, resource=name, mig_strategy=mig_strategy, config=config, cdi_root=cdi_root
        )
        for name in sorted(names)
    ]


if __name__ == "__main__":
    main()
