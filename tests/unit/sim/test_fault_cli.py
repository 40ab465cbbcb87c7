"""`gpu-operator sim fault`: bad input named with the fix before anything is touched, and the real
node's fault played on its own host tree (the kwok nodes' path, which reads the Node, runs in
tests/integration/test_sim_faults.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.sim.commands.faultinject import check_action, inject
from gpu_operator.sim.commands.state import SimState
from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.hardware.faults import FaultError
from gpu_operator.sim.realnode.realspec import host_spec
from gpu_operator.sim.realnode.toolkit import gpus


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            (None, False, False, None),
            "no fault given: give exactly one of --xid N, --gone, --clear or --reboot",
        ),
        (
            ("79", True, False, None),
            "--xid and --gone given: give exactly one of --xid N, --gone, --clear or --reboot",
        ),
        (
            ("x", False, False, None),
            "--xid 'x': give the Xid as a whole number from 1 to 1023, e.g. --xid 79",
        ),
        (
            (None, False, True, 1),
            "--gpu with --clear: --clear brings back every GPU of the node (a reboot): leave out --gpu",
        ),
        ((None, True, False, -1), "--gpu -1: give a GPU index from 0"),
    ],
)
def test_bad_combinations_are_named_with_the_fix(args: tuple, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(FaultError) as err:
        check_action(*args)
    assert str(err.value).startswith(message)


def test_good_combinations() -> None:
    assert check_action("79", False, False, 3) == ("xid", 79)
    assert check_action(None, True, False, None) == ("gone", None)
    assert check_action(None, False, True, None) == ("clear", None)


def test_the_command_refuses_bad_input_first_and_a_missing_simulator(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["sim", "fault", "gpu-node-0", "--xid", "seventy-nine", "--dir", str(tmp_path)])
    assert bad.exit_code == 1
    assert "--xid 'seventy-nine': give the Xid as a whole number" in bad.output
    none = runner.invoke(app, ["sim", "fault", "gpu-node-0", "--gone", "--dir", str(tmp_path)])
    assert none.exit_code == 1
    assert (
        f"no simulator runs in {tmp_path}: start one (gpu-operator sim up) or give its --dir" in none.output
    )
    helped = runner.invoke(app, ["sim", "fault", "--help"])
    assert helped.exit_code == 0 and "--clear" in helped.output and "--gone" in helped.output


def test_on_the_real_node_the_fault_goes_to_its_own_host_tree(tmp_path: Path) -> None:
    root = tmp_path / "real-node-host"
    hosttree.build(host_spec("host-driver"), root)
    state = SimState(
        dir=str(tmp_path),
        server="",
        kubeconfig="",
        binaries="",
        real_node={"name": "real-node-0", "host_root": str(root)},
    )
    first = gpus(root)[1]
    said = inject(state, "real-node-0", "gone", None, 1)
    assert said.startswith(f"node real-node-0: GPU 1 ({first.address}) fell off the bus")
    assert [g.address for g in gpus(root)] == [gpus(root)[0].address]
    assert (tmp_path / "real-node-host.faults" / "faults.json").is_file()  # the book, outside the tree
    with pytest.raises(FaultError, match=r"--gpu 2: this host has 2 GPU\(s\): give an index from 0 to 1"):
        inject(state, "real-node-0", "xid", 79, 2)
    inject(state, "real-node-0", "clear", None, None)
    assert len(gpus(root)) == 2
