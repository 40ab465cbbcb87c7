"""The docs' commands, checked without a cluster: every fenced command block of README.md and
docs/*.md is run by tests/integration/test_docs_commands.py or says in the page why not
(tests/support/docblocks.py), and every `gpu-operator` command and option the docs name, in a
block or in a `code span`, is one the CLI has (its typer/click command tree)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import typer

from gpu_operator.cli import app
from tests.support import docblocks
from tests.support.docblocks import Block, gpu_operator_invocations, quote_problem, simple_commands

# What the docs test's shell runs (tests/integration/test_docs_commands.py): our CLI, kubectl (the
# virtualenv's), and of ./dev what takes seconds. Anything else in an unmarked block needs a marker.
RUNNABLE = {"gpu-operator", "kubectl"}
RUNNABLE_DEV = {"chart", "helm", "gpu-operator"}
PLACEHOLDER = re.compile(r"^\[|^<.*>$|^[A-Z][A-Z_]+$|\.\.\.\]?$")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def runnable_problem(block: Block) -> str | None:
    """Why the integration test could not run this unmarked block, or None."""
    try:
        commands = block.commands()
    except ValueError as err:
        return str(err)
    for command in commands:
        for ws in simple_commands(command.text):
            if ws[0] == "./dev" and (len(ws) < 2 or ws[1] not in RUNNABLE_DEV):
                return f"`{' '.join(ws[:2])}` is not run by the docs test"
            if ws[0] not in RUNNABLE | {"./dev"}:
                return f"`{ws[0]}` is not run by the docs test"
            if any(PLACEHOLDER.search(w) for w in ws[1:]):
                return f"`{' '.join(ws)}` has a placeholder or an [optional] part"
        if "sudo " in command.text:
            return "needs root (sudo)"
    return None


def test_every_command_block_is_run_or_says_why_not() -> None:
    problems = []
    for block in docblocks.all_blocks():
        if block.lang == "" and block.looks_like_console:
            problems.append(f"{block.id}: a `$ ` prompt in an untagged fence: tag it ```console")
        elif block.marker is not None and not block.is_command_block:
            problems.append(f"{block.id}: a not-run marker on a ```{block.lang} block, which is never run")
        elif block.marker is not None and (block.reason is None or len(block.reason.split()) < 3):
            problems.append(
                f"{block.id}: the marker must read <!-- not run here: REASON --> with a reason, "
                f"not {block.marker!r}"
            )
        elif block.runnable and (problem := runnable_problem(block)):
            problems.append(
                f"{block.id}: {problem}: mark it <!-- not run here: REASON --> or make it runnable"
            )
    assert problems == []


def test_the_docs_have_blocks_of_both_kinds() -> None:
    """The checks above see the blocks: some run, some marked (a parser that found none would pass)."""
    command_blocks = [b for b in docblocks.all_blocks() if b.is_command_block]
    assert len([b for b in command_blocks if b.runnable]) >= 8
    assert len([b for b in command_blocks if b.reason]) >= 10


# -- gpu-operator commands and options ------------------------------------------------------------


@functools.cache
def cli() -> Any:
    """The CLI's click command tree, as `gpu-operator` parses its arguments."""
    return typer.main.get_command(app)


def _options(command: Any) -> dict[str, bool]:
    """{option name: takes a value} of a click command (typer's vendored click)."""
    names = {name: False for name in command.get_help_option_names(typer.Context(command))}
    for param in command.params:
        if param.param_type_name == "option":
            for name in [*param.opts, *param.secondary_opts]:
                names[name] = not (param.is_flag or param.count)
    return names


def invocation_problem(args: list[str]) -> str | None:
    """What in `gpu-operator ARGS` the CLI does not have, or None. Synopsis forms are read as
    such: [optional] parts, `a|b` alternatives, `...` repeats, placeholders (FILE, NODE)."""
    command: Any = cli()
    path: list[str] = []
    rest = [a for a in (w.strip("[]") for w in args) if a and a not in ("|", "...")]
    while rest and getattr(command, "commands", None) and not rest[0].startswith("-"):
        alternatives = rest[0].replace("\\|", "|").split("|")
        missing = [a for a in alternatives if a not in command.commands]
        if missing:
            return f"no command `gpu-operator {' '.join([*path, missing[0]])}`"
        command = command.commands[alternatives[0]]
        path.append(rest.pop(0))
        if len(alternatives) > 1:  # `upgrade status|retry NODE|pause`: the rest belongs to several
            return None
    options = _options(command)
    takes_value = False
    for word in rest:
        if takes_value:
            takes_value = False
            continue
        if not word.startswith("-") or word == "-":
            continue
        name = word.split("=", 1)[0]
        if name not in options:
            return f"`gpu-operator {' '.join(path)}` has no option {name}"
        takes_value = options[name] and "=" not in word
    return None


def named_invocations() -> list[tuple[str, list[str]]]:
    """(where, args) of every `gpu-operator` command the docs name: in command blocks and untagged
    blocks (marked or not), and in code spans of the prose that start with `gpu-operator `."""
    found: list[tuple[str, list[str]]] = []
    for page in docblocks.PAGES:
        for block in docblocks.blocks(page):
            if block.lang not in docblocks.COMMAND_LANGS | {""}:
                continue
            if block.lang == "console" or block.looks_like_console:  # the commands, not their output
                texts = [c.text for c in docblocks.console_commands(block.body)]
            else:
                texts = list(block.body)
            for text in texts:
                found += [(block.id, args) for args in gpu_operator_invocations(text)]
        in_fence = False
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if docblocks.FENCE.match(line) or line.strip() == "```":
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            for span in SPAN.findall(line):
                text = span.replace("\\|", "|").removeprefix("sudo ")
                if text.startswith("gpu-operator "):
                    where = f"{page.relative_to(docblocks.ROOT)}:{n}"
                    found.append(
                        (where, docblocks.words(text.replace("|", " | ") if " | " in text else text)[1:])
                    )
    return found


def test_every_gpu_operator_command_and_option_the_docs_name_exists() -> None:
    named = named_invocations()
    assert len(named) > 100, "the docs name far more gpu-operator commands: the extraction broke"
    problems = [f"{where}: {problem}" for where, args in named if (problem := invocation_problem(args))]
    assert problems == []


def test_the_command_check_finds_what_does_not_exist() -> None:
    assert invocation_problem(["sim", "up", "--shape", "dgx-h100:4", "[--operator]"]) is None
    assert invocation_problem(["status", "[--kubeconfig", "FILE]", "[--max-nodes", "40]"]) is None
    assert (
        invocation_problem(
            ["render", "--policy", "FILE", "[--nodes", "FILE", "|", "--shape", "...]", "-o", "yaml|json"]
        )
        is None
    )
    assert invocation_problem(["upgrade", "status|retry", "NODE|pause|resume"]) is None
    assert invocation_problem(["vfio-manage", "persist", "--remove", "--host-root=/"]) is None
    assert invocation_problem(["sim", "demo", "--no-keep"]) is None
    assert (
        invocation_problem(["sim", "up", "--no-such-flag"])
        == "`gpu-operator sim up` has no option --no-such-flag"
    )
    assert invocation_problem(["sim", "start"]) == "no command `gpu-operator sim start`"
    assert invocation_problem(["upgrade", "status|restart"]) == "no command `gpu-operator upgrade restart`"
    assert invocation_problem(["nvidia-validator"]) == "no command `gpu-operator nvidia-validator`"
    # a value that looks like an option is the option's value, not an option
    assert invocation_problem(["render", "--namespace", "-x"]) is None


def test_commands_are_found_in_shell_text() -> None:
    assert gpu_operator_invocations('eval "$(gpu-operator sim up --shape cpu:1)"') == [
        ["sim", "up", "--shape", "cpu:1"]
    ]
    assert gpu_operator_invocations("for n in a b; do NODE_NAME=$n gpu-operator node probe --once; done") == [
        ["node", "probe", "--once"]
    ]
    assert gpu_operator_invocations("sudo gpu-operator sim down && ./dev gpu-operator status | head") == [
        ["sim", "down"],
        ["status"],
    ]
    # a namespace or a release called gpu-operator is not the command
    assert gpu_operator_invocations("./dev helm install gpu-operator x.tgz -n gpu-operator") == []
    assert gpu_operator_invocations("gpu-operator status   # exit 1 while not ready") == [["status"]]


# -- the marker and the runnable check ------------------------------------------------------------


def _page(tmp_path: Path, text: str) -> list[Block]:
    page = tmp_path / "page.md"
    page.write_text(text)
    return docblocks.blocks(page)


def test_a_marker_needs_its_reason_and_a_runnable_block_runs_only_what_the_test_can(tmp_path: Path) -> None:
    (marked, bare, sudo, synopsis, console) = _page(
        tmp_path,
        (
            "<!-- not run here: needs root and a real GPU -->\n```bash\nsudo reboot\n```\n"
            "<!-- not run here: -->\n```bash\nls\n```\n"
            "```bash\nsudo gpu-operator sim up --real-node\n```\n"
            "```bash\ngpu-operator status [--kubeconfig FILE]\n```\n"
            "```console\n$ gpu-operator sim status\nsimulator in x\n...\n$ kubectl get nodes\n```\n"
        ),
    )
    assert (marked.reason, marked.runnable) == ("needs root and a real GPU", False)
    assert bare.reason == "" and not bare.runnable  # and the test above calls it a problem
    assert runnable_problem(sudo) == "needs root (sudo)"
    assert (
        runnable_problem(synopsis)
        == "`gpu-operator status [--kubeconfig FILE]` has a placeholder or an [optional] part"
    )
    assert runnable_problem(console) is None
    assert [c.output for c in console.commands()] == [("simulator in x", "..."), ()]


def test_quoted_output_matches_only_the_real_output() -> None:
    real = (
        "NAME          STATUS   AGE\ngpu-cluster   ready    2m3s\n\n"
        "pod gpu-operator-5c8d9f7b4-x7kqz on 10.244.0.7 (pid 4242)\nlast line\n"
    )
    quote = ["NAME STATUS AGE", "gpu-cluster   ready    20s", "..."]
    assert quote_problem(quote, real) is None
    assert (
        quote_problem(["...", "pod gpu-operator-74cc94f88f-fx6hz on 10.244.0.3 (pid 1)", "last line"], real)
        is None
    )
    assert quote_problem(["...", "last line"], real) is None
    assert quote_problem([], real) is None
    assert quote_problem(["gpu-cluster ready 20s", "..."], real) is not None  # not where the output starts
    assert quote_problem(["NAME STATUS AGE", "gpu-cluster ready 20s"], real) is not None  # the output goes on
    assert quote_problem(["...", "gpu-cluster notReady 20s", "..."], real) is not None  # a value differs
    assert quote_problem(["...", "last line", "NAME STATUS AGE"], real) is not None  # order counts


def test_a_yaml_block_that_names_its_example_file_is_that_file() -> None:
    """A page that shows a file the commands apply (`... (`examples/x.yaml`):` then ```yaml) shows it as it is."""
    shown = 0
    for page in docblocks.PAGES:
        lines = page.read_text().splitlines()
        for block in docblocks.blocks(page):
            named = (
                re.search(r"\(`(examples/[\w.-]+\.yaml)`\):$", lines[block.line - 3])
                if block.line > 2
                else None
            )
            if block.lang == "yaml" and named:
                shown += 1
                assert "\n".join(block.body) + "\n" == (docblocks.ROOT / named[1]).read_text(), f"{block.id}"
    assert shown >= 1


def dev_commands() -> set[str]:
    """The subcommands `./dev` dispatches (its case labels)."""
    text = (docblocks.ROOT / "dev").read_text()
    return set(re.findall(r"^  ([a-z][a-z-]*)\)", text, re.MULTILINE))


def test_every_dev_command_the_docs_name_exists() -> None:
    assert {"test", "helm", "chart"} <= dev_commands()
    named = set()
    for page in docblocks.PAGES:
        named |= {(page.name, word) for word in re.findall(r"\./dev ([a-z][a-z-]*)", page.read_text())}
    assert len(named) >= 5
    assert sorted(n for n in named if n[1] not in dev_commands()) == []


def test_a_go_librarys_diagnostic_line_is_not_part_of_the_output() -> None:
    """helm's client-go may note on stderr that a watch ended, depending on timing: the quote
    without it still matches; anything else before the quoted start still fails."""
    quoted = ['release "gpu-operator" uninstalled']
    noted = 'I1127 15:26:56.013226   30985 reflector.go:556] "Warning: watch ended"\nrelease "gpu-operator" uninstalled\n'
    assert quote_problem(quoted, noted) is None
    assert quote_problem(quoted, 'Error: something else\nrelease "gpu-operator" uninstalled\n') is not None
