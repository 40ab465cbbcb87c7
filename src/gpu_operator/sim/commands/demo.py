"""`sim demo`: simulator + CRDs + default ClusterPolicy (or, with --gpucluster, the GPUCluster of the
DRA stack) + operator, watched live until Ready."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpu_operator.sim.commands import session
from gpu_operator.sim.commands.state import SimState
from gpu_operator.statusview.table import StatusView

POLICY_NAME = "cluster-policy"
GPUCLUSTER_NAME = "gpu-cluster"


@dataclass
class Timings:
    marks: list[tuple[str, float]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)

    def mark(self, what: str) -> None:
        now = time.monotonic()
        self.marks.append((what, now - self.last))
        self.last = now


def policy_spec(state: SimState) -> dict[str, Any]:
    """Every default (examples/clusterpolicy-default.yaml: spec {}); with a real node, its host
    tree as hostPaths.rootFS and what our operands need to run there (see `realspec.policy_spec`)."""
    from gpu_operator.sim.realnode.realspec import policy_spec as real_node_spec

    host = state.real_node.get("host_root")
    return real_node_spec(host) if host else {}


def create_default_policy(state: SimState, gpucluster: bool = False) -> bool:
    """Create the ClusterPolicy (`policy_spec`), or the GPUCluster with the chart's DRA driver
    (`spec: {draDriver: {}}`). False if it exists already."""
    from lightkube.codecs import from_dict
    from lightkube.core.exceptions import ApiError

    import gpu_operator.kube.client  # noqa: F401 - registers our kinds for from_dict

    body = (
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "GPUCluster",
            "metadata": {"name": GPUCLUSTER_NAME},
            "spec": {"draDriver": {}},
        }
        if gpucluster
        else {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": POLICY_NAME},
            "spec": policy_spec(state),
        }
    )
    client = session.admin_client(state)
    try:
        client.create(from_dict(body))
        return True
    except ApiError as err:
        if err.status.code == 409:
            return False
        raise
    finally:
        client.close()


def done(view: StatusView) -> bool:
    """Ready, with operands running: the default policy deploys some on every GPU node."""
    return view.ready and (not view.rows or view.counts()[1] > 0)


def watch(
    state: SimState,
    console: Console,
    timeout: float,
    started: float,
    kind: str = "ClusterPolicy",
) -> StatusView:
    """Show the status view live (a progress line per change when not on a terminal) until it is
    ready or `timeout` passes; returns the last view."""
    from gpu_operator.statusview.collect import collect
    from gpu_operator.statusview.render import one_line, render_view

    client = session.admin_client(state)
    operator = state.proc("operator")

    def frame(view: StatusView) -> Group:
        elapsed = time.monotonic() - started
        head = Text(
            f"waiting for the {kind} to become ready: {elapsed:4.0f}s (limit {timeout:.0f}s)", style="bold"
        )
        return Group(head, render_view(view, max_nodes=20, legend=False))

    deadline = time.monotonic() + timeout
    view = collect(client, session.OPERATOR_NAMESPACE)
    last_line = ""
    try:
        with Live(
            frame(view),
            console=console,
            refresh_per_second=4,
            transient=True,
            auto_refresh=console.is_terminal,
        ) as live:
            while not done(view) and time.monotonic() < deadline:
                if operator is not None and not operator.alive:
                    raise session.SimError(f"the operator exited; see {operator.log}")
                time.sleep(1.0)
                view = collect(client, session.OPERATOR_NAMESPACE)
                if console.is_terminal:
                    live.update(frame(view))
                elif (line := one_line(view)) != last_line:
                    console.print(Text(f"[{time.monotonic() - started:5.1f}s] {line}"), highlight=False)
                    last_line = line
    finally:
        client.close()
    return view


def summary(state: SimState, view: StatusView, timings: Timings, helm: bool = False) -> Table:
    table = Table(title="Demo summary", title_justify="left", show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for what, seconds in timings.marks:
        table.add_row(what, f"{seconds:.1f}s")
    ready, expected = view.counts()
    table.add_row("GPU nodes", str(len(view.rows)))
    table.add_row("operand pods ready", f"{ready}/{expected}")
    policy = view.policy
    table.add_row(
        policy.kind if policy else "ClusterPolicy",
        Text(f"{policy.name}: {policy.state} ({policy.reason})" if policy else "none"),
    )
    table.add_row(
        "operator log",
        Text(
            f"kubectl -n {session.OPERATOR_NAMESPACE} logs deploy/gpu-operator (the chart's pod)"
            if helm
            else str(Path(state.dir) / "logs" / "operator.log")
        ),
    )
    real = real_node_lines(state, view)
    if real:
        table.add_row("real node", Text("\n".join(real)))
    return table


def not_ready_text(view: StatusView, timeout: float) -> Text:
    """The demo's last line when the policy did not become ready: the problems as plain text
    (they quote the cluster: `states not ready: [state-driver ...]` is no markup)."""
    text = Text(f"not ready after {timeout:.0f}s:", style="bold red")
    text.append(" " + "; ".join(view.problems or ["no operand DaemonSet selects the GPU nodes yet"]))
    return text


def real_node_lines(state: SimState, view: StatusView) -> list[str]:
    """What really ran on the real node: its row's validation and the status files the
    validator's init containers wrote into its host tree."""
    from gpu_operator.vocabulary import VALIDATIONS_DIR

    info = state.real_node
    if not info:
        return []
    row = next((r for r in view.rows if r.name == info["name"]), None)
    ran = [c for c, cell in row.cells.items() if cell.ready] if row else []
    files = sorted(p.name for p in (Path(info["host_root"]) / VALIDATIONS_DIR.lstrip("/")).glob("*-ready"))
    return [
        f"{info['name']} ({info['shape']}): kubelet + containerd running our image",
        f"pods that really ran there: {', '.join(ran) or 'none ready'}; "
        f"validation {row.validation if row else 'not seen'}",
        f"status files they wrote: {', '.join(files) or 'none'} in {info['host_root']}{VALIDATIONS_DIR}",
        f"pod logs: {Path(info['dir']) / 'pod-logs'}",
    ]


def _command(name: str) -> str:
    """`name` if the shell finds it, else its path in this Python environment (e.g. .venv/bin)."""
    import shutil
    import sys

    if shutil.which(name):
        return name
    candidate = Path(sys.prefix) / "bin" / name
    return str(candidate) if candidate.exists() else name


def look_around(state: SimState, keep: bool, teardown: str, gpucluster: bool = False) -> str:
    ns = session.OPERATOR_NAMESPACE
    kubectl, gpu_operator = _command("kubectl"), _command("gpu-operator")
    lines = [
        "Look around (in another shell):"
        if keep
        else "Look around (run the demo with --keep, then in another shell):",
        f"  export KUBECONFIG={state.kubeconfig}",
        f"  {gpu_operator} status",
        f"  {kubectl} get nodes -L nvidia.com/gpu.present,nvidia.com/gpu.deploy.driver",
        f"  {kubectl} -n {ns} get daemonsets,pods -o wide",
        f"  {kubectl} get gpucluster {GPUCLUSTER_NAME} -o yaml"
        if gpucluster
        else f"  {kubectl} get clusterpolicy {POLICY_NAME} -o yaml",
        *([f"  {kubectl} get deviceclasses,resourceslices"] if gpucluster else []),
        f"  logs: {Path(state.dir) / 'logs'}",
    ]
    if keep:
        lines += ["Everything keeps running. Stop it with:", f"  {gpu_operator} sim down"]
    else:
        lines += [teardown]
    return "\n".join(lines)


def demo(
    directory: Path,
    shapes: list[str],
    keep: bool,
    timeout: float,
    console: Console,
    real_node: str | None = None,
    helm: bool = False,
    gpucluster: bool = False,
    kubernetes: str = "current",
) -> int:
    """Returns the exit code: 0 when the ClusterPolicy (or GPUCluster) became ready, 1 when not in time."""
    kind, name = ("GPUCluster", GPUCLUSTER_NAME) if gpucluster else ("ClusterPolicy", POLICY_NAME)

    def progress(msg: str) -> None:
        console.print(f"[dim]sim:[/] {escape(msg)}", highlight=False)

    timings = Timings()
    state, fresh = session.up(directory, shapes, progress, real_node=real_node, kubernetes=kubernetes)
    timings.mark(
        ("control plane + fake nodes" + (" + real node" if real_node else ""))
        if fresh
        else "attach to the running simulator"
    )
    operator_was_running = bool((p := state.proc("operator")) and p.alive)
    # the operator process this demo starts (and stops again on a simulator it attached to)
    starts_operator = not helm and not operator_was_running
    try:
        if helm:
            # The chart brings the CRDs (its hook Job), the operator (its Deployment) and the
            # ClusterPolicy, all on the real node; nothing is started here.
            session.install_chart(state, [], [], progress)
            timings.mark("helm install (CRD hook Job on the real node)")
        else:
            session.start_operator(state, progress)
            timings.mark("CRDs + operator start" if starts_operator else "operator already running")
        created = False
        if helm:
            progress(f"the chart created ClusterPolicy {POLICY_NAME} from its values")
        elif created := create_default_policy(state, gpucluster):
            if gpucluster:
                progress(
                    f"created GPUCluster {name} (the DRA stack) with the chart's DRA driver image; the "
                    "simulator's plugin stand-in publishes each GPU node's ResourceSlice"
                )
            elif state.real_node:
                progress(
                    f"created ClusterPolicy {POLICY_NAME}: defaults, hostPaths.rootFS = the real node's "
                    f"host tree {state.real_node['host_root']}"
                )
            else:
                progress(f"created ClusterPolicy {POLICY_NAME} with every default (spec: {{}})")
        else:
            progress(f"{kind} {name} exists already: watching it")
        view = watch(state, console, timeout, time.monotonic(), kind)
        timings.mark(f"{kind} {'created' if created else 'from the chart' if helm else 'found'} -> ready")
        from gpu_operator.statusview.render import render_view

        console.print(render_view(view, max_nodes=20))
        code = 0
        if done(view):
            console.print(summary(state, view, timings, helm))
        else:
            console.print(not_ready_text(view, timeout))
            code = 1
        console.print(
            Text(look_around(state, keep, teardown_text(fresh, starts_operator, helm), gpucluster)),
            highlight=False,
        )
        return code
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    finally:
        if not keep:
            if fresh:
                session.down(directory, progress)
            elif starts_operator and (p := state.proc("operator")) is not None and p.alive:
                # We attached to someone's simulator: leave it as we found it.
                state.stop(["operator"])
                state.processes = [p for p in state.processes if p.name != "operator"]
                state.save()
                progress("stopped the operator this demo started; the simulator keeps running")


def teardown_text(fresh: bool, starts_operator: bool, helm: bool = False) -> str:
    """What happens when the demo ends without --keep, as it will happen: a simulator it started
    goes; on one it attached to, only an operator process it started is stopped."""
    if fresh:
        return "Tearing down now."
    if starts_operator:
        return "Stopping the operator this demo started; the simulator keeps running."
    if helm:
        return "The simulator ran before this demo: it keeps running, with the chart's release installed."
    return (
        "The simulator and its operator ran before this demo: both keep running "
        "(gpu-operator sim down stops them)."
    )
