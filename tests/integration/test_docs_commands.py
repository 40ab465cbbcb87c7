"""Every fenced command block of README.md and docs/*.md that its page does not mark `<!-- not run
here: REASON -->` runs here as written, in one shell as a reader's would be (variables a command
exports, like `eval "$(gpu-operator sim up)"`'s KUBECONFIG, reach the next ones), from the
repository root, with the virtualenv's `gpu-operator` and `kubectl` first on PATH. Every command
must exit 0, and the lines a ```console block quotes after it must be its real output
(tests/support/docblocks.py `quote_problem`: `...` for lines left out; times, ages, pids, ports,
pod IPs and generated name suffixes may differ). A command that only reads (`kubectl get`,
`gpu-operator status`, ...) is repeated until that holds, within a deadline: the page's "a few
seconds later". tests/unit/docs/test_doc_commands.py checks, without a cluster, that every other
block carries a reason and that the `gpu-operator` commands and options the docs name exist.
As on a reader's machine, `./dev chart` writes dist/charts/ of this checkout.

The pages share one simulator: the first `gpu-operator sim up` a page runs starts it in this
module's own cache directory (XDG_CACHE_HOME, shown in the output as `~/.cache`, where a reader's
default simulator lives) and later pages' `sim up` with the same nodes reuse it; it is stopped
at the end. The pages run in ORDER: a page whose commands need what another leaves (a running
simulator, the operator) comes after it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_operator.sim.plane import binaries
from tests.support import docblocks
from tests.support.docblocks import Block, Command, quote_problem, simple_commands
from tests.support.waiting import wait_for

# helm.md before the pages that start the operator: the chart brings its own (its ServiceAccount
# gpu-operator/gpu-operator would collide with the simulator operator's); kubevirt.md reads the
# ClusterPolicy upgrades.md leaves.
ORDER = [
    "docs/distributions.md",
    "docs/install.md",
    "docs/api.md",
    "docs/helm.md",
    "docs/dra.md",
    "docs/upgrades.md",
    "docs/kubevirt.md",
    "docs/vm-passthrough.md",
]
READS = (
    ["kubectl", "get"],
    ["gpu-operator", "status"],
    ["gpu-operator", "upgrade", "status"],
    ["gpu-operator", "sim", "status"],
)
DEADLINE = 120.0
COMMAND_TIMEOUT = 300


def ordered_blocks() -> list[Block]:
    runnable = [b for b in docblocks.all_blocks() if b.runnable]
    pages = {str(b.page.relative_to(docblocks.ROOT)) for b in runnable}
    assert pages <= set(ORDER), f"pages with runnable blocks missing from ORDER: {sorted(pages - set(ORDER))}"
    return sorted(runnable, key=lambda b: (ORDER.index(str(b.page.relative_to(docblocks.ROOT))), b.line))


@dataclass
class Ran:
    command: str
    rc: int
    output: str
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.problem is None


class Shell:
    """One reader's shell: the exported environment carries from command to command."""

    def __init__(self, home: Path) -> None:
        # as after `./dev setup`: helm built (a first build would print its progress into the output)
        # and named in GPU_OPERATOR_HELM, as `./dev setup` and `./dev test` export it (`gpu-operator images`)
        helm = subprocess.run(
            [str(docblocks.ROOT / "tools" / "helm" / "build.sh")],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        ).stdout.splitlines()[-1]
        self.cache = home / "cache"
        self.cache.mkdir(parents=True)
        self.env_file = home / "env.sh"
        self.env_file.write_text("")
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        venv_bin = str(Path(sys.executable).parent)
        env.update(
            PATH=f"{venv_bin}:{env.get('PATH', '')}",
            XDG_CACHE_HOME=str(self.cache),
            GPU_OPERATOR_CONTROLPLANE=str(binaries.locate(build=True).root),
            GPU_OPERATOR_HELM=helm,
        )
        self.env = env
        self.failed: str | None = None  # the block that failed, if one did

    def run(self, command: Command) -> Ran:
        script = (
            f'source "{self.env_file}"\ncd "{docblocks.ROOT}"\n{command.text}\n'
            f'__rc=$?\nexport -p > "{self.env_file}"\nexit $__rc\n'
        )
        done = subprocess.run(
            ["bash", "-c", script],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        output = done.stdout.replace(str(self.cache), "~/.cache")
        return Ran(command.text, done.returncode, output, quote_problem(command.output, output))

    def stop_simulator(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["gpu-operator", "sim", "down"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


KUBECTL_VALUED = {"-n", "--namespace", "--context", "--kubeconfig", "-l", "--selector"}


def verb_words(ws: list[str]) -> list[str]:
    """`kubectl -n NS get pods` -> [kubectl, get, pods]: kubectl's global options before its verb left out."""
    if ws[0] != "kubectl":
        return ws
    i = 1
    while i < len(ws) and ws[i].startswith("-"):
        i += 2 if ws[i] in KUBECTL_VALUED else 1
    return [ws[0], *ws[i:]]


def reads_only(command: Command) -> bool:
    found = [verb_words(ws) for ws in simple_commands(command.text)]
    return bool(found) and all(any(ws[: len(r)] == r for r in READS) for ws in found)


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    started = time.monotonic()
    reader = Shell(tmp_path_factory.mktemp("docs-shell"))
    yield reader
    down = reader.stop_simulator()
    print(f"docs commands: {time.monotonic() - started:.0f} s in all")
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.parametrize("block", ordered_blocks(), ids=lambda b: b.id)
def test_the_block_runs_as_written_and_prints_what_the_page_quotes(shell: Shell, block: Block) -> None:
    if shell.failed:  # the simulator carries what that block left half done: fail at once, not at a deadline
        pytest.fail(f"not run: {shell.failed} failed before it, on the simulator this block shares")
    shell.failed = block.id
    run_block(shell, block)
    shell.failed = None


def run_block(shell: Shell, block: Block) -> None:
    for command in block.commands():
        if reads_only(command):

            def again(c: Command = command) -> Ran:
                return shell.run(c)

            ran = wait_for(
                f"`{command.text}` to print what {block.id} quotes",
                again,
                until=lambda r: r.ok,
                timeout=DEADLINE,
                interval=1.0,
            )
        else:
            ran = shell.run(command)
        assert ran.rc == 0, f"{block.id}: `{command.text}` exited {ran.rc}:\n{ran.output[-4000:]}"
        assert ran.problem is None, (
            f"{block.id}: `{command.text}`: {ran.problem}\n--- real output ---\n{ran.output}"
        )


def test_some_blocks_run_here() -> None:
    """The parametrization above is not empty: a parser that found no block would pass it."""
    assert len(ordered_blocks()) >= 8
