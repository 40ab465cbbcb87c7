"""`--set` read as Helm reads it (sim/plane/helmset.py): each case's expected values are checked
against our parser and, where a helm command is found ($GPU_OPERATOR_HELM or `helm` on PATH),
against what `helm template --set` renders for a chart that prints its .Values."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.sim.plane.helm import HelmInstallError, merge, parse_set, user_layers, values_for
from gpu_operator.sim.plane.helmset import scalar

# The tiny chart's defaults: a --set list replaces a default list whole (Helm coalesces lists
# as a whole; the chart's defaults are not beneath --set), while maps merge.
CHART_DEFAULTS: dict[str, Any] = {"chartlist": ["a", "b"], "chartmap": {"k": "v"}}
DEEPEST: dict[str, Any] = {"k": 1}
for _ in range(30):
    DEEPEST = {"k": DEEPEST}
ENV = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}

# (the --set arguments, the values of the -f file beneath them, what they give)
CASES: list[tuple[list[str], dict[str, Any], dict[str, Any]]] = [
    (
        ["validator.cuda.env[0].name=CUDA_WORKLOAD"],
        {},
        {"validator": {"cuda": {"env": [{"name": "CUDA_WORKLOAD"}]}}},
    ),
    (["operator.imagePullSecrets={old-creds}"], {}, {"operator": {"imagePullSecrets": ["old-creds"]}}),
    (["l={a,b,3,true}"], {}, {"l": ["a", "b", 3, True]}),
    (["l={}"], {}, {"l": [""]}),
    (["a=1,b=2"], {}, {"a": 1, "b": 2}),
    (["a=1,"], {}, {"a": 1}),
    (
        ["a=[1],b=yes,c=0x10,d=1.5,e=07,f=9223372036854775808,g=~"],
        {},
        {"a": "[1]", "b": "yes", "c": "0x10", "d": "1.5", "e": "07", "f": "9223372036854775808", "g": "~"},
    ),
    (
        ["a=True,b=FALSE,c=Null,d=0,e=-0,f=+5,g=-12,h=9223372036854775807,i=falſe"],
        {},
        {
            "a": True,
            "b": False,
            "c": None,
            "d": 0,
            "e": 0,
            "f": 5,
            "g": -12,
            "h": 9223372036854775807,
            "i": False,
        },
    ),
    (["a=", "b=x=y"], {}, {"a": "", "b": "x=y"}),
    ([r"a\.b=1\,2", r"l={x\,y,z}"], {}, {"a.b": "1,2", "l": ["x,y", "z"]}),
    (["a[2].b[1]=v"], {}, {"a": [None, None, {"b": [None, "v"]}]}),
    (["a[1][0]=x", "a[0]=y"], {}, {"a": ["y", ["x"]]}),
    (["a.b.c=1", "a.b.d=2,a.e=3"], {}, {"a": {"b": {"c": 1, "d": 2}, "e": 3}}),
    # onto a list a values file gave: one element changes, its other keys and the other elements stay
    (["env[1].name=Z"], ENV, {"env": [{"name": "A", "value": "1"}, {"name": "Z", "value": "2"}]}),
    (["env[3]=x"], ENV, {"env": [*ENV["env"], None, "x"]}),
    (["env[0].x.y=1"], {"env": ["plain"]}, {"env": [{"x": {"y": 1}}]}),
    (["m.b=2"], {"m": {"a": 1}}, {"m": {"a": 1, "b": 2}}),
    (["m.a=x"], {"m": {"a": {"deep": 1}}}, {"m": {"a": "x"}}),
    # over the chart's default list: Helm keeps none of its elements
    (["chartlist[1]=x"], {}, {"chartlist": [None, "x"]}),
    (["chartmap.j=w"], {}, {"chartmap": {"j": "w"}}),
    ([".".join("k" * 31) + "=1"], {}, DEEPEST),  # 30 dots: Helm's most
]


def _apply(sets: list[str], beneath: dict[str, Any]) -> dict[str, Any]:
    values = beneath
    for pair in sets:
        values = parse_set(pair, values)
    return values


@pytest.mark.parametrize(("sets", "beneath", "expected"), CASES)
def test_set_gives_what_helm_gives(
    sets: list[str], beneath: dict[str, Any], expected: dict[str, Any]
) -> None:
    before = yaml.safe_dump(beneath)
    assert _apply(sets, beneath) == merge(beneath, expected)
    assert yaml.safe_dump(beneath) == before  # the values beneath are not changed


# (argument, what the message says); Helm refuses each of these too
REFUSED = [
    ("a[x]=1", "the list index 'x' of a is not a number: write a[0]=VALUE"),
    ("a[-1]=1", "the list index -1 of a is outside 0..65536"),
    ("a[65537]=1", "the list index 65537 of a is outside 0..65536"),
    ("a[0]x=1", "'x' after a[0]: write a[0]=VALUE"),
    ("a[1]]=2", "']' after a[1]"),
    ("a[ 1]=2", "the list index ' 1' of a is not a number"),
    ("a={x,y", "a list has no closing '}'"),
    ("novalue", "novalue has no value: write novalue=VALUE"),
    ("a.b", "a.b has no value: write a.b=VALUE"),
    ("a,b=1", "a has no value"),
    ("a={x}y", "y has no value"),
    ("a..b=1", "an empty key name after a"),
    ("a=1,,b=2", "an empty key name"),
    ("x.y=1", "x is the int 3 in the values beneath, not a map"),
    ("x[0]=1", "x is the int 3 in the values beneath, not a list"),
    ("l[0][0]=1", "l[0] is the str 's' in the values beneath, not a list"),
    (".".join("k" * 32) + "=1", ".".join("k" * 31) + " nests deeper than 30 keys (Helm's limit)"),
]
# Helm takes these silently and sets nothing (or an empty list): refused here
STRICTER = [
    ("=3", "an empty key name"),
    ("a.", "an empty key name after a"),
    ("a[0]", "a[0] has no value"),
    ("a[0=1", "a[ has no closing ']'"),
]
BENEATH_REFUSED = {"x": 3, "l": ["s"]}


@pytest.mark.parametrize(("argument", "message"), REFUSED + STRICTER)
def test_what_helm_refuses_is_named_with_the_fix(argument: str, message: str) -> None:
    with pytest.raises(HelmInstallError) as err:
        parse_set(argument, BENEATH_REFUSED)
    assert str(err.value).startswith(f"--set {argument!r}: {message}")


def test_a_maximal_index_is_taken() -> None:
    assert parse_set("a[65536]=z")["a"][65536] == "z"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("TRUE", True),
        ("null", None),
        ("0", 0),
        ("-0", 0),
        ("+7", 7),
        ("", ""),
        ("00", "00"),
        ("1_000", "1_000"),
        ("١٢", "١٢"),
        (" 1", " 1"),
        ("-9223372036854775809", "-9223372036854775809"),
    ],
)
def test_scalars_are_typed_as_helm_types_them(text: str, value: Any) -> None:
    assert scalar(text) == value and type(scalar(text)) is type(value)


def test_a_set_index_changes_one_element_of_the_simulators_list(tmp_path: Path) -> None:
    """As `helm -f real-node-values.yaml --set ...`: the simulator's env entry keeps its value."""
    plain, _ = values_for(tmp_path, "n", "/h", [], [])
    values, _ = values_for(tmp_path, "n", "/h", [], ["validator.cuda.env[0].name=CUDA_WORKLOAD"])
    assert values["validator"]["cuda"]["env"] == [
        {**plain["validator"]["cuda"]["env"][0], "name": "CUDA_WORKLOAD"}
    ]
    with pytest.raises(
        HelmInstallError, match=r"operator\.affinity is null in the values beneath, not a map"
    ):
        values_for(tmp_path, "n", "/h", [], ["operator.affinity.x=1"])


def test_sets_go_onto_the_values_files(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(ENV))
    layers = user_layers([mine], ["env[0].value=9"])
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = merge(merged, layer)
    assert merged == {"env": [{"name": "A", "value": 9}, ENV["env"][1]]}


# --- the same cases through the helm command -------------------------------------------------


def _helm() -> str:
    found = os.environ.get("GPU_OPERATOR_HELM") or shutil.which("helm")
    if not found or not Path(found).exists():
        pytest.fail(
            "no helm command to compare with: ./dev test sets GPU_OPERATOR_HELM (tools/helm/build.sh "
            "prints the path); set it, or put helm on PATH"
        )
    return found


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("setchart")
    (root / "templates").mkdir()
    (root / "Chart.yaml").write_text("apiVersion: v2\nname: setchart\nversion: 0.1.0\n")
    (root / "values.yaml").write_text(yaml.safe_dump(CHART_DEFAULTS))
    (root / "templates" / "values.yaml").write_text("{{ toYaml .Values }}\n")
    return root


def _helm_template(chart: Path, sets: list[str], beneath: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    file = chart.parent / "beneath.yaml"
    file.write_text(yaml.safe_dump(beneath))
    argv = [_helm(), "template", "r", str(chart), "-f", str(file), *(a for s in sets for a in ("--set", s))]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("sets", "beneath", "expected"), CASES)
def test_helm_gives_the_same(
    chart: Path, sets: list[str], beneath: dict[str, Any], expected: dict[str, Any]
) -> None:
    done = _helm_template(chart, sets, beneath)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == merge(CHART_DEFAULTS, merge(beneath, expected))


@pytest.mark.parametrize(("argument", "message"), REFUSED)
def test_helm_refuses_the_same(chart: Path, argument: str, message: str) -> None:
    done = _helm_template(chart, [argument], BENEATH_REFUSED)
    assert done.returncode != 0, done.stdout  # the chart itself renders: test_helm_gives_the_same


@pytest.mark.parametrize(
    ("argument", "helm_gives"), [("=3", {}), ("a.", {}), ("a[0]", {"a": []}), ("a[0=1", {})]
)
def test_helm_takes_the_stricter_ones_silently(
    chart: Path, argument: str, helm_gives: dict[str, Any]
) -> None:
    done = _helm_template(chart, [argument], {})
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == {**CHART_DEFAULTS, **helm_gives}


ABSURD = [  # (argument, what the one line says after the argument)
    (
        "a" + ".a" * 10_000 + "=1",
        ".".join("a" * 31) + " nests deeper than 30 keys (Helm's limit): use a --values file",
    ),
    (
        "a" + "[0]" * 10_000 + "=1",
        "a" + "[0]" * 30 + " has more than 30 list indices (this parser's limit; "
        "Helm's strvals has none for indices): set the value in a --values file",
    ),
    ("a" + "[0].b" * 40 + "=1", "a" + "[0].b" * 30 + " has more than 30 list indices"),
    ("a" + "[0]" * 31 + "=1", "a" + "[0]" * 30 + " has more than 30 list indices"),
]


@pytest.mark.parametrize(("argument", "message"), ABSURD)
def test_absurd_nesting_is_one_line_naming_the_pair(argument: str, message: str) -> None:
    """Nesting without end is refused with one line, not a traceback (the parser recurses per
    level): the dots at Helm's own limit (strvals.MaxNestedNameLevel, 30), the list indices at
    ours; a long argument is named by its start and its length."""
    with pytest.raises(HelmInstallError) as err:
        parse_set(argument)
    line = str(err.value)
    assert "\n" not in line and len(line) < 400, line
    shown = (
        repr(argument)
        if len(argument) <= 100
        else f"{argument[:60]!r} ({len(argument)} characters)".replace("' (", "...' (", 1)
    )
    assert line.startswith(f"--set {shown}: {message}"), line


def test_the_deepest_nesting_taken_is_taken() -> None:
    deepest = "a" + "[0]" * 30 + "".join(f".k{i}" for i in range(30)) + "=1"
    value: Any = parse_set(deepest)["a"]
    for _ in range(30):
        (value,) = value
    for i in range(30):
        value = value[f"k{i}"]
    assert value == 1


def test_absurd_nesting_on_the_command_line_is_one_line_and_exit_1() -> None:
    from typer.testing import CliRunner

    from gpu_operator.cli import app

    argument = "driver" + ".x" * 10_000 + "=1"
    result = CliRunner().invoke(app, ["images", "--set", argument])
    assert result.exit_code != 0
    assert (
        "Traceback" not in result.output
        and result.exception is None
        or isinstance(result.exception, SystemExit)
    )
    (line,) = [ln for ln in result.output.splitlines() if ln.strip()]
    assert "nests deeper than 30 keys (Helm's limit)" in line and len(line) < 400, line


@pytest.mark.parametrize("argument", [a for a, _ in ABSURD[:1]] + ["a" + ".a" * 31 + "=1"])
def test_helm_refuses_the_dotted_nesting_too(chart: Path, argument: str) -> None:
    done = _helm_template(chart, [argument], {})
    assert done.returncode != 0
    assert "value name nested level is greater than maximum supported nested level of 30" in done.stderr


def test_helm_takes_31_list_indices_which_this_parser_refuses(chart: Path) -> None:
    """The one divergence: Helm's strvals limits no index nesting (only each index, 65536)."""
    done = _helm_template(chart, ["a" + "[0]" * 31 + "=1"], {})
    assert done.returncode == 0, done.stderr
    value: Any = yaml.safe_load(done.stdout)["a"]
    for _ in range(31):
        (value,) = value
    assert value == 1


def test_helm_gives_the_deepest_nesting_taken_the_same(chart: Path) -> None:
    deepest = "a" + "[0]" * 30 + "".join(f".k{i}" for i in range(30)) + "=1"
    done = _helm_template(chart, [deepest], {})
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == merge(CHART_DEFAULTS, parse_set(deepest))
