"""Commands of the sim area (registered on the top-level app by gpu_operator.cli)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpu_operator.shapes import names as shape_names

sim_app = typer.Typer(
    name="sim",
    no_args_is_help=True,
    help="The simulator: a real control plane on 127.0.0.1 with fake GPU nodes (kwok). `up` and "
    "`demo --keep` leave it running in the background; `down` stops it.",
)

# No "[default: ...]" in a help text: rich's markup takes it for a tag and drops it.
DirOption = Annotated[
    Path | None,
    typer.Option("--dir", help="State and work directory (default: ~/.cache/gpu-operator/sim/current)."),
]
ShapeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--shape",
        help=f"Fake nodes as SHAPE[:COUNT] (repeatable); shapes: {', '.join(shape_names())}.",
        show_default="dgx-h100:4",
    ),
]


SIM_EXTRA_HINT = (
    "the simulator needs the `sim` extra (cryptography, for its control plane's "
    "certificates): pip install 'gpu-operator[sim]'"
)


@sim_app.callback()
def _needs_sim_extra() -> None:
    """Every sim command runs a control plane with its own PKI: say which extra is missing."""
    import importlib.util

    if importlib.util.find_spec("cryptography") is None:
        typer.secho(f"error: {SIM_EXTRA_HINT}", fg="red", err=True)
        raise typer.Exit(2)


RealNodeOption = Annotated[
    bool,
    typer.Option(
        "--real-node",
        help="Also start one real node (kubelet + containerd, as root) that runs our image "
        "for real; operands of NVIDIA images stay on the fake nodes.",
    ),
]
RealNodeShapeOption = Annotated[
    str,
    typer.Option(
        "--real-node-shape",
        help="The real node's GPU shape: its labels, GPU resources and host tree "
        "(host-driver: driver on the host; dgx-h100: none, validation waits for the operator's driver).",
    ),
]


KubernetesOption = Annotated[
    str,
    typer.Option(
        "--kubernetes",
        help="The control plane's Kubernetes: current (the version we develop on) or floor "
        "(the oldest we support, the chart's kubeVersion; fake nodes only).",
    ),
]
HelmOption = Annotated[
    bool,
    typer.Option(
        "--helm",
        help="Install our chart with real Helm (release and namespace gpu-operator): the operator "
        "runs as the chart's Deployment on the real node, its hook Jobs too. Needs --real-node. The values "
        "the real node needs are written to real-node-values.yaml in --dir and shown.",
    ),
]
ValuesOption = Annotated[
    list[Path] | None,
    typer.Option("--values", "-f", help="With --helm: a values file on top of the simulator's (repeatable)."),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="With --helm: KEY=VALUE on top of the values files (repeatable), as helm --set."
    ),
]


def _dir(directory: Path | None) -> Path:
    from gpu_operator.sim.commands.state import default_dir

    return (directory or default_dir()).expanduser().resolve()


def _progress(msg: str) -> None:
    typer.echo(f"sim: {msg}", err=True)


def _fail(err: Exception) -> typer.Exit:
    typer.secho(f"error: {err}", fg="red", err=True)
    return typer.Exit(1)


@sim_app.command("up")
def up(
    shape: ShapeOption = None,
    directory: DirOption = None,
    operator: Annotated[bool, typer.Option(help="Also start the operator (and apply the CRDs).")] = False,
    real_node: RealNodeOption = False,
    real_node_shape: RealNodeShapeOption = "host-driver",
    helm: HelmOption = False,
    values: ValuesOption = None,
    set_values: SetOption = None,
    kubernetes: KubernetesOption = "current",
    nfd: Annotated[
        bool,
        typer.Option(
            "--nfd",
            help="Also play NFD's master: NodeFeature labels (GPU feature discovery's) onto the "
            "Nodes, as on a cluster whose user runs NFD (the chart's nfd.enabled=false).",
        ),
    ] = False,
    registry: Annotated[
        bool,
        typer.Option(
            "--registry",
            help="Also start an OCI registry (HTTPS with the simulator's CA, basic auth; "
            "built from Go modules) that the real node pulls from; its address, user and password file "
            "are printed.",
        ),
    ] = False,
) -> None:
    """Start the control plane and fake nodes in the background and print `export KUBECONFIG=...`."""
    from gpu_operator.shapes import ShapeError
    from gpu_operator.sim.commands import session
    from gpu_operator.sim.realnode.realnode import RealNodeError

    if helm and not real_node:
        raise typer.BadParameter(
            "--helm needs --real-node: the chart's operator pod runs on the real node", param_hint="--helm"
        )
    if helm and operator:
        raise typer.BadParameter(
            "--helm runs the operator as the chart's pod: leave out --operator", param_hint="--operator"
        )
    if (values or set_values) and not helm:
        raise typer.BadParameter("--values and --set are for --helm", param_hint="--values/--set")
    from gpu_operator.sim.commands.reuse import refuse_unusable
    from gpu_operator.sim.plane.helm import HelmInstallError, real_node_values, user_layers
    from gpu_operator.sim.plane.registry import RegistryError

    try:
        # bad input stops here, before anything starts (a --set onto the simulator's own values too)
        user_layers(values or [], set_values or [], real_node_values("node", "/"))
        refuse_unusable(_dir(directory), shape, real_node_shape if real_node else None, nfd)
        state, _ = session.up(
            _dir(directory),
            shape or session.DEFAULT_SHAPES,
            _progress,
            real_node=real_node_shape if real_node else None,
            kubernetes=kubernetes,
            nfd=nfd,
            registry=registry,
        )
        if operator:
            session.start_operator(state, _progress)
        if helm:
            session.install_chart(state, values or [], set_values or [], _progress)
    except (session.SimError, ShapeError, RealNodeError, HelmInstallError, RegistryError) as err:
        raise _fail(err) from err
    typer.echo(f"export KUBECONFIG={state.kubeconfig}")


@sim_app.command("status")
def status(directory: DirOption = None) -> None:
    """What the recorded simulator runs (processes, apiserver, nodes). Exit 1 if nothing runs."""
    from gpu_operator.sim.commands import session

    where = _dir(directory)
    rep = session.report(where)
    if rep.state is None:
        typer.echo(f"no simulator recorded in {where} (start one: gpu-operator sim up)")
        raise typer.Exit(1)
    state = rep.state
    typer.echo(
        f"simulator in {where}: apiserver {state.server} {'ready' if rep.apiserver_ready else 'NOT ready'}"
    )
    for proc in state.processes:
        mark = "running" if proc.name in rep.alive else "stopped"
        typer.echo(f"  {proc.name:<24} pid {proc.pid:<8} {mark:<8} {proc.log}")
    if rep.apiserver_ready:
        client = session.admin_client(state)
        try:
            from lightkube.resources.core_v1 import Node

            count = len(list(client.list(Node)))
        finally:
            client.close()
        typer.echo(f"  nodes: {count} ({' '.join(state.shapes) or 'none added'})")
        typer.echo(f"export KUBECONFIG={state.kubeconfig}")
    if rep.dead:
        typer.echo(f"not running: {', '.join(rep.dead)} (see their logs; `gpu-operator sim down` cleans up)")
    raise typer.Exit(0 if rep.apiserver_ready and not rep.dead else 1)


@sim_app.command("down")
def down(directory: DirOption = None) -> None:
    """Stop everything the simulator recorded (SIGTERM, then SIGKILL). Safe to run twice."""
    from gpu_operator.sim.commands import session

    where = _dir(directory)
    if not session.down(where, _progress):
        typer.echo(f"nothing running in {where}")


@sim_app.command("demo")
def demo(
    shape: ShapeOption = None,
    directory: DirOption = None,
    keep: Annotated[
        bool, typer.Option("--keep/--no-keep", help="Leave the simulator and operator running afterwards.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the ClusterPolicy to be ready.")] = 240,
    real_node: RealNodeOption = False,
    real_node_shape: RealNodeShapeOption = "host-driver",
    helm: Annotated[
        bool,
        typer.Option(
            "--helm",
            help="Install our chart with real Helm instead of starting the operator: its "
            "operator pod and hook Jobs run on the real node (needs --real-node).",
        ),
    ] = False,
    gpucluster: Annotated[
        bool,
        typer.Option(
            "--gpucluster",
            help="Create the GPUCluster gpu-cluster (the DRA stack: NVIDIA's DRA driver, "
            "DRA validation) instead of the default ClusterPolicy; see docs/dra.md.",
        ),
    ] = False,
    kubernetes: KubernetesOption = "current",
    nested: Annotated[
        bool,
        typer.Option(
            "--nested",
            help="Seed 001's chain on two simulators: a host cluster (8x H100 on vfio-pci, KubeVirt "
            "kept in step, virt-handler's device plugin), a VM's pod that takes --gpus of them, and the cluster "
            "inside that VM (our chart with the platform package's guest values) up to nvidia.com/gpu on its "
            "node; see docs/vm-passthrough.md.",
        ),
    ] = False,
    gpus: Annotated[int, typer.Option(help="With --nested: GPUs the VM takes.")] = 2,
    tenant_resource: Annotated[
        str,
        typer.Option(
            "--tenant-resource",
            help="With --nested: the resource name the tenant's VM asks for (seed 001's "
            "Kubernetes gpus[].name); it must be the one the host publishes.",
        ),
    ] = "nvidia.com/H100_SXM5_80GB",
) -> None:
    """From nothing to a Ready ClusterPolicy (with --gpucluster: a Ready GPUCluster, the DRA stack):
    simulator + CRDs + default policy + operator, with a
    live nodes x components view, then a summary. Tears everything down unless --keep."""
    if helm and not real_node:
        raise typer.BadParameter(
            "--helm needs --real-node: the chart's operator pod runs on the real node", param_hint="--helm"
        )
    if nested:
        if shape or helm or real_node or gpucluster or kubernetes != "current":
            raise typer.BadParameter(
                "--nested brings its own two clusters: leave out --shape, --real-node, "
                "--helm, --gpucluster and --kubernetes",
                param_hint="--nested",
            )
        from gpu_operator.sim.commands.nested import demo as nested_demo

        raise typer.Exit(nested_demo(_dir(directory), gpus, tenant_resource, keep, timeout))
    if gpucluster and (helm or real_node):
        raise typer.BadParameter(
            "--gpucluster runs on the kwok GPU nodes only: leave out --real-node/--helm",
            param_hint="--gpucluster",
        )
    from gpu_operator.shapes import ShapeError
    from gpu_operator.sim.commands import session
    from gpu_operator.sim.commands.demo import demo as run_demo
    from gpu_operator.sim.commands.reuse import refuse_unusable
    from gpu_operator.sim.realnode.realnode import RealNodeError
    from gpu_operator.statusview.render import make_console

    try:
        refuse_unusable(_dir(directory), shape, real_node_shape if real_node else None)
        code = run_demo(
            _dir(directory),
            shape or session.DEFAULT_SHAPES,
            keep,
            timeout,
            make_console(),
            real_node=real_node_shape if real_node else None,
            helm=helm,
            gpucluster=gpucluster,
            kubernetes=kubernetes,
        )
    except (session.SimError, ShapeError, RealNodeError) as err:
        raise _fail(err) from err
    raise typer.Exit(code)


@sim_app.command("fault")
def fault(
    node: Annotated[
        str, typer.Argument(help="The node: a fake GPU node (kubectl get nodes) or the real node.")
    ],
    xid: Annotated[
        str | None,
        typer.Option(
            "--xid",
            metavar="N",
            help="Append the driver's Xid N record for the GPU to the node's kernel log "
            "(NVRM: Xid (PCI:...): N, ...), e.g. 79 (fallen off the bus), 48 (double-bit ECC), 13 "
            "(an application's fault).",
        ),
    ] = None,
    gpu: Annotated[
        int | None,
        typer.Option(
            "--gpu", metavar="I", help="The GPU, by index in NVML's order (PCI address); 0 by default."
        ),
    ] = None,
    gone: Annotated[
        bool,
        typer.Option(
            "--gone",
            help="The GPU falls off the bus: Xid 79 logged, its PCI device leaves sysfs, "
            "/proc/driver/nvidia and its /dev/nvidiaN disappears.",
        ),
    ] = False,
    clear: Annotated[
        bool,
        typer.Option(
            "--clear",
            help="Clear every fault of the node as a reboot does: the GPUs back, an empty "
            "kernel log, a new boot_id.",
        ),
    ] = False,
    reboot: Annotated[
        bool,
        typer.Option(
            "--reboot",
            help="Reboot a vGPU host node (shape vgpu-host-h100): what --clear does, and its "
            "VFs, vGPUs and MIG mode (Hopper) are lost; its kubelet ends its pods at shutdown and their "
            "DaemonSets make new ones.",
        ),
    ] = False,
    directory: DirOption = None,
) -> None:
    """Inject a GPU fault into a node's host, as the kernel and NVIDIA's driver leave it.

    On a fake node our health agent (played where the operator-validator pod runs) reads it and
    publishes the node's GPU health report; on the real node the device-plugin stand-in reports
    the GPU Unhealthy to the kubelet (critical Xids, a lost GPU; not the application Xids 13, 31,
    43, 45, 68, 109), so nvidia.com/gpu allocatable drops. --clear makes it Healthy again. On a
    vGPU host, --reboot loses the vGPU host state, and the new sandbox validator pod's
    vgpu-host-state pass puts it back.
    """
    from gpu_operator.sim.commands import session
    from gpu_operator.sim.commands.faultinject import check_action, inject
    from gpu_operator.sim.hardware.faults import FaultError

    where = _dir(directory)
    try:
        action, number = check_action(xid, gone, clear, gpu, reboot)
        state = session.running(where)
        if state is None:
            raise session.SimError(
                f"no simulator runs in {where}: start one (gpu-operator sim up) or give its --dir"
            )
        typer.echo(inject(state, node, action, number, gpu))
    except (FaultError, session.SimError) as err:
        raise _fail(err) from err


@sim_app.command("stand-ins", hidden=True)
def stand_ins(
    kubeconfig: Annotated[str, typer.Option(help="Admin kubeconfig of the simulator.")],
    nfd: Annotated[bool, typer.Option("--nfd", help="Also play NFD's master.")] = False,
    hosts: Annotated[
        Path | None,
        typer.Option(help="The kwok nodes' host trees (<sim dir>/hosts): also play our health agent."),
    ] = None,
) -> None:
    """What node components do to the API on kwok nodes (sim/standins/roster.py); `sim up` starts it."""
    from gpu_operator.sim.standins.roster import serve

    serve(kubeconfig, nfd=nfd, hosts=hosts)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
    app.add_typer(sim_app)
