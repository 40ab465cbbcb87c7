"""`gpu-operator sim up --real-node --helm`: the values the simulator writes, the user's layers on
top (files, then --set, as Helm layers them), and the option errors. The install itself runs in
tests/integration/test_helm_real_node.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.sim.plane.helm import VALUES_FILE, HelmInstallError, merge, parse_set, values_for
from tests.support.chart import objects, render_chart


def test_the_written_values_file_is_what_is_installed_and_reads_plainly(tmp_path: Path) -> None:
    values, path = values_for(tmp_path, "real-node-0", "/srv/host", [], [])
    assert path == tmp_path / VALUES_FILE
    text = path.read_text()
    assert "&id" not in text and "*id" not in text  # no YAML anchors for a reader to resolve
    assert yaml.safe_load(text) == values
    assert values["operator"]["nodeSelector"] == {"kubernetes.io/hostname": "real-node-0"}
    assert values["hostPaths"]["rootFS"] == "/srv/host"
    # the chart takes them: the operator Deployment is pinned to the real node
    deployment = next(o for o in objects(render_chart(values)) if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "real-node-0"


def test_user_files_then_set_override_the_simulator_values(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("psa:\n  enabled: false\ndriver:\n  enabled: false\n")
    values, _ = values_for(tmp_path, "n", "/h", [mine], ["driver.enabled=true", "operator.logLevel=debug"])
    assert values["psa"] == {"enabled": False}
    assert values["driver"] == {"enabled": True}
    # a map in a later layer merges key by key: the real node's nodeSelector stays
    assert values["operator"]["logLevel"] == "debug"
    assert values["operator"]["nodeSelector"] == {"kubernetes.io/hostname": "n"}


def test_set_types_values_like_helm() -> None:
    assert parse_set("a.b=3") == {"a": {"b": 3}}
    assert parse_set("a=true") == {"a": True}
    assert parse_set("a=") == {"a": ""}
    assert merge({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": 5}, "l": [2]}) == {
        "a": {"b": 5, "c": 2},
        "l": [2],
    }


@pytest.mark.parametrize(
    ("pair", "fix"), [("novalue", "write novalue=VALUE"), ("=3", "name every key, e.g. a.b=1")]
)
def test_a_malformed_set_names_the_form(pair: str, fix: str) -> None:
    with pytest.raises(HelmInstallError, match=fix):
        parse_set(pair)


def test_a_values_file_that_is_not_a_mapping_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(HelmInstallError, match=f"--values {bad}: not a mapping"):
        values_for(tmp_path, "n", "/h", [bad], [])
    with pytest.raises(HelmInstallError, match=f"--values {tmp_path / 'absent.yaml'}"):
        values_for(tmp_path, "n", "/h", [tmp_path / "absent.yaml"], [])


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["--helm"], "--helm needs --real-node"),
        (["--helm", "--real-node", "--operator"], "leave out --operator"),
        (["--set", "a=b"], "--values and --set are for --helm"),
    ],
)
def test_sim_up_option_errors_say_what_to_change(args: list[str], hint: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sim", "up", "--dir", str(tmp_path), *args])
    assert result.exit_code == 2
    assert hint in " ".join(result.output.split()), result.output
