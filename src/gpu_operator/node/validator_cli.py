"""`nvidia-validator`: the command NVIDIA's validator image provides, with the same flags and env.

Pods rendered by the operator run `nvidia-validator` with COMPONENT, WITH_WAIT, NODE_NAME,
OPERATOR_NAMESPACE, ... in the environment, so the same pod works with NVIDIA's validator image
and with ours. Flags, when given, override the environment variable of the same meaning.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

# flag -> environment variable, as upstream's validator defines them
FLAG_ENV = {
    "node_name": "NODE_NAME",
    "namespace": "OPERATOR_NAMESPACE",
    "with_wait": "WITH_WAIT",
    "with_workload": "WITH_WORKLOAD",
    "cleanup_all": "CLEANUP_ALL",
    "output_dir": "OUTPUT_DIR",
    "sleep_interval_seconds": "SLEEP_INTERVAL_SECONDS",
    "mig_strategy": "MIG_STRATEGY",
    "metrics_port": "METRICS_PORT",
    "default_gpu_workload_config": "DEFAULT_GPU_WORKLOAD_CONFIG",
}

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def nvidia_validator(
    component: Annotated[
        str,
        typer.Option(
            "--component", "-c", envvar="COMPONENT", help="driver, toolkit, cuda, plugin, ... or metrics."
        ),
    ],
    node_name: Annotated[str | None, typer.Option("--node-name", "-n")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", "--ns")] = None,
    with_wait: Annotated[bool | None, typer.Option("--with-wait/--no-with-wait", "-w")] = None,
    with_workload: Annotated[bool | None, typer.Option("--with-workload/--no-with-workload", "-l")] = None,
    cleanup_all: Annotated[bool | None, typer.Option("--cleanup-all", "-r")] = None,
    output_dir: Annotated[str | None, typer.Option("--output-dir", "-o")] = None,
    sleep_interval_seconds: Annotated[int | None, typer.Option("--sleep-interval-seconds", "-s")] = None,
    mig_strategy: Annotated[str | None, typer.Option("--mig-strategy", "-m")] = None,
    metrics_port: Annotated[int | None, typer.Option("--metrics-port", "-p")] = None,
    default_gpu_workload_config: Annotated[
        str | None, typer.Option("--default-gpu-workload-config", "-g")
    ] = None,
    host_root: Annotated[
        str | None,
        typer.Option(
            "--host-root-mount",
            envvar="GPU_OPERATOR_HOST_ROOT",
            help="Where the host's / is mounted in this container (default: /host when it exists).",
        ),
    ] = None,
) -> None:
    """Validate one component and write its status file (upstream's nvidia-validator contract)."""
    from gpu_operator.node.cli import run_component

    given = locals()
    environ = dict(os.environ)
    for flag, name in FLAG_ENV.items():
        value = given[flag]
        if value is not None:
            environ[name] = str(value).lower() if isinstance(value, bool) else str(value)
    environ["COMPONENT"] = component
    run_component(component, host_root, environ)


def main() -> None:
    app()
