"""The scale benchmark's command line (bench/scale.py): node counts, the windows and timeouts of each
phase, the policy or GPUCluster, the peer operator and its pairs, the restart and health phases,
profiling and where the results go."""

from __future__ import annotations

import argparse
from pathlib import Path

from health import add_arguments as add_health_arguments

HERE = Path(__file__).resolve().parent


def parse_args(description: str | None) -> argparse.Namespace:
    """The options of `scale.py` (its docstring is the description `--help` prints)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--idle-seconds", type=float, default=300.0)
    parser.add_argument(
        "--churn-seconds",
        type=float,
        default=30.0,
        help="window after the operator is quiet, before any policy: CPU under kwok's churn",
    )
    parser.add_argument(
        "--sim-window",
        type=float,
        default=20.0,
        help="window with no operator: the simulator's own apiserver load (0: skip)",
    )
    parser.add_argument(
        "--node-lease-seconds",
        type=int,
        default=1200,
        help="kwok's node Lease duration (the simulator's heartbeat load). 1200 (renewed every 300 s): "
        "with 40, kwok's 4 renewing workers fall behind at 1,000 nodes on a loaded machine, Leases lapse, "
        "the node controller marks nodes and their pods not Ready and a rollout never ends (bench/README.md)",
    )
    parser.add_argument("--joins", type=int, default=100)
    parser.add_argument("--join-gap", type=float, default=0.2, help="seconds between two joins")
    parser.add_argument("--join-timeout", type=float, default=30.0)
    parser.add_argument(
        "--joins-after",
        type=float,
        default=0.0,
        help="start the joins no earlier than this many seconds after the policy's creation "
        "(0: as soon as the fleet is labelled), so that two operators that label at different "
        "speeds meet the same phase of the operand rollout",
    )
    parser.add_argument("--label-timeout", type=float, default=600.0)
    parser.add_argument("--ready-timeout", type=float, default=120.0, help="max wait for /readyz")
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=900.0,
        help="max wait for the ClusterPolicy to be ready before the idle window",
    )
    parser.add_argument(
        "--concurrency", type=int, default=32, help="patches in flight (operator and ceiling)"
    )
    parser.add_argument("--ceiling-patches", type=int, default=2000)
    parser.add_argument(
        "--policy", type=Path, help="ClusterPolicy file for both operators (default: spec {})"
    )
    parser.add_argument(
        "--gpucluster",
        action="store_true",
        help="create the GPUCluster of examples/gpucluster.yaml (the DRA stack) instead of a "
        "ClusterPolicy; the simulator's DRA plugin stand-in publishes the ResourceSlices",
    )
    parser.add_argument(
        "--peer-cmd",
        help="also run this operator (placeholders {kubeconfig} {namespace} "
        "{metrics_port} {health_port}) through the same procedure; see bench/README.md",
    )
    parser.add_argument(
        "--peer-crds",
        type=Path,
        nargs="+",
        help="directories of CRD files to apply for the peer (default: ours)",
    )
    parser.add_argument(
        "--nfd",
        action="store_true",
        help="run NFD's master stand-in beside either operator (both charts deploy NFD by default): "
        "GFD's NodeFeature labels reach the Nodes through it",
    )
    parser.add_argument("--only-peer", action="store_true", help="with --peer-cmd: skip our operator")
    parser.add_argument(
        "--peer-metrics",
        action="store_true",
        help="the peer serves our metrics on "
        "{metrics_port} (an earlier revision of ours): read them as for ours",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="run ours with --leader-elect, as the chart does (give the peer's command its own flag)",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="after the idle window: SIGTERM, start the same "
        "command again, measure until it leads and has caught up, then its writes over an idle "
        "window (bench/restart.py)",
    )
    parser.add_argument(
        "--restart-timeout", type=float, default=300.0, help="max wait for the restarted operator"
    )
    add_health_arguments(parser)
    parser.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="with --peer-cmd: run ours and the peer this many "
        "times each, interleaved (A B A B ...), and report each figure's median [min-max]",
    )
    parser.add_argument(
        "--tail-timeout",
        type=float,
        default=300,
        help="after the policy is ready, wait (at most this long) until the operator has written nothing "
        "for 15 s before the idle window opens: the stand-ins still act on the last nodes (0: open it at once)",
    )
    parser.add_argument(
        "--feature-gates",
        default="",
        metavar="NAME=BOOL,...",
        help="Kubernetes feature gates for the simulator's apiserver, controller-manager and scheduler "
        "(both operators meet the same plane); see bench/README.md on StaleControllerConsistencyDaemonSet",
    )
    parser.add_argument("--profile", action="store_true", help="run our operator under cProfile")
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    return parser.parse_args()
