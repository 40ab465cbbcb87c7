"""`sim up` / `sim demo` on a simulator that runs already: options it cannot give (other nodes, a
real node) are refused with what runs, bad `--set`/`--values` input stops `sim up` before anything
starts, and the demo says only what it does (sim/commands/reuse.py, sim/commands/demo.py). No control plane: the
running simulator is a recorded state handed to the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.sim.commands import session
from gpu_operator.sim.commands.demo import teardown_text
from gpu_operator.sim.commands.reuse import conflicts, refuse_unusable
from gpu_operator.sim.commands.state import SimState


def running(tmp_path: Path, shapes: list[str], real_node: dict[str, Any] | None = None) -> SimState:
    return SimState(
        dir=str(tmp_path),
        server="https://127.0.0.1:6443",
        kubeconfig=str(tmp_path / "admin.kubeconfig"),
        binaries="/bin",
        shapes=shapes,
        real_node=real_node or {},
    )


def test_only_what_the_running_simulator_lacks_conflicts(tmp_path: Path) -> None:
    state = running(tmp_path, ["dgx-h100:4"])
    assert conflicts(state, None, None) == []  # nothing asked: use it as it is
    assert conflicts(state, ["dgx-h100:4"], None) == []  # the same fleet, named explicitly
    (shape,) = conflicts(state, ["dgx-h100:8", "cpu:2"], None)
    assert (
        shape == "--shape dgx-h100:8 --shape cpu:2: it runs the fake nodes dgx-h100:4, made when it started"
    )
    assert conflicts(state, ["dgx-h100:4,pool=a"], None)  # other labels are other nodes
    assert conflicts(state, ["dgx-h100"], None)  # COUNT defaults to 1
    (real,) = conflicts(state, None, "host-driver")
    assert real == "--real-node (shape host-driver): it was started without a real node"
    with_real = running(tmp_path, ["dgx-h100:4"], {"name": "real-node-0", "shape": "dgx-h100"})
    assert conflicts(with_real, None, "dgx-h100") == []
    assert conflicts(with_real, None, "host-driver") == [
        "--real-node (shape host-driver): its real node has shape dgx-h100"
    ]
    assert conflicts(state, None, None, nfd=True) == [
        "--nfd: its stand-ins do not play NFD's master (it was started without --nfd)"
    ]
    state.nfd = True
    assert conflicts(state, None, None, nfd=True) == [] and conflicts(state, None, None) == []


def test_the_refusal_names_what_runs_and_the_ways_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session, "running", lambda directory: running(tmp_path, ["dgx-h100:4"]))
    with pytest.raises(session.SimError) as err:
        refuse_unusable(tmp_path, ["dgx-h100:8", "cpu:2"], None)
    text = str(err.value)
    assert f"a simulator already runs in {tmp_path}" in text and "dgx-h100:4" in text
    assert "gpu-operator sim down" in text and "another --dir" in text and "Leave those options out" in text
    refuse_unusable(tmp_path, None, None)  # no option that cannot apply: no refusal
    monkeypatch.setattr(session, "running", lambda directory: None)
    refuse_unusable(tmp_path, ["cpu:2"], None)  # nothing runs: a new simulator gets these nodes


@pytest.mark.parametrize("command", ["up", "demo"])
def test_sim_up_and_demo_refuse_a_shape_before_starting_anything(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session, "running", lambda directory: running(tmp_path, ["dgx-h100:4"]))

    def must_not_start(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("started although the options cannot apply")

    monkeypatch.setattr(session, "up", must_not_start)
    result = CliRunner().invoke(
        app, ["sim", command, "--dir", str(tmp_path), "--shape", "dgx-h100:8", "--shape", "cpu:2"]
    )
    assert result.exit_code == 1, result.output
    text = " ".join(result.stderr.split())
    assert text.startswith(f"error: a simulator already runs in {tmp_path}"), text
    assert "--shape dgx-h100:8 --shape cpu:2: it runs the fake nodes dgx-h100:4" in text


@pytest.mark.parametrize(
    ("content", "sets", "named"),
    [
        (None, ["novalue"], "--set 'novalue': novalue has no value: write novalue=VALUE"),
        # onto the simulator's own values (real-node-values.yaml), as `helm -f` that file would
        (
            None,
            ["operator.affinity.x=1"],
            "--set 'operator.affinity.x=1': operator.affinity is null in the values beneath",
        ),
        ("- a\n- b\n", [], "not a mapping of values (its top level is a list)"),
    ],
)
def test_sim_up_refuses_bad_helm_input_before_starting_anything(
    content: str | None, sets: list[str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_start(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("started before the values were checked")

    monkeypatch.setattr(session, "running", must_not_start)
    monkeypatch.setattr(session, "up", must_not_start)
    args = [f"--set={s}" for s in sets]
    if content is not None:
        values = tmp_path / "values.yaml"
        values.write_text(content)
        args += ["--values", str(values)]
    result = CliRunner().invoke(
        app, ["sim", "up", "--dir", str(tmp_path / "sim"), "--real-node", "--helm", *args]
    )
    assert result.exit_code == 1, result.output
    assert named in " ".join(result.stderr.split())


def test_the_demo_says_what_its_end_does() -> None:
    assert teardown_text(fresh=True, starts_operator=True) == "Tearing down now."
    assert teardown_text(fresh=False, starts_operator=True).startswith(
        "Stopping the operator this demo started"
    )
    # attached to a simulator whose operator ran already: nothing is stopped, and it says so
    said = teardown_text(fresh=False, starts_operator=False)
    assert "Stopping" not in said and "keep running" in said
    assert "chart's release" in teardown_text(fresh=False, starts_operator=False, helm=True)
