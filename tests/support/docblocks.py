"""The fenced command blocks of README.md and docs/*.md, for the docs tests: what each block runs,
what output it quotes, and whether the page marks it as not run here (and why).

A block is a command block when its fence says ```bash, ```sh, ```shell or ```console; an
untagged fence whose first line is a `$ ` prompt is one too, and must say ```console. A command
block is run by tests/integration/test_docs_commands.py unless the line right before its fence is

    <!-- not run here: REASON -->

(root or a real node, an image build, minutes of wall time, a synopsis with [optional] parts, a
node of the reader's own cluster, ...). In a ```console block a command starts at `$ `; the
lines up to the next `$ ` are the output the page quotes, with `...` for lines left out. In the
other languages every line that is not a comment is a command and no output is quoted.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_LANGS = {"bash", "sh", "shell", "console"}
MARKER = re.compile(r"<!--\s*not run here:(?P<reason>.*?)-->")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
GAP = "..."


@dataclass(frozen=True)
class Command:
    text: str  # as the shell gets it: continuation lines kept, comments left to the shell
    output: tuple[
        str, ...
    ]  # the lines the page quotes after it (console blocks), GAP where some are left out


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: tuple[str, ...]
    marker: str | None  # the HTML comment right before the fence, if it is a not-run marker
    reason: str | None  # the marker's reason, stripped

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def looks_like_console(self) -> bool:
        first = next((ln for ln in self.body if ln.strip()), "")
        return first.startswith("$ ")

    @property
    def is_command_block(self) -> bool:
        return self.lang in COMMAND_LANGS or (self.lang == "" and self.looks_like_console)

    @property
    def runnable(self) -> bool:
        return self.is_command_block and self.marker is None

    def commands(self) -> list[Command]:
        return console_commands(self.body) if self.lang == "console" else script_commands(self.body)


def blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent = len(opening["indent"])
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = tuple(ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1 : end])
        before = lines[i - 1].strip() if i > 0 else ""
        marker = before if before.startswith("<!--") and "not run" in before else None
        matched = MARKER.fullmatch(marker) if marker else None
        reason = matched["reason"].strip() if matched else None
        found.append(Block(page, i + 1, opening["lang"], body, marker, reason))
        i = end + 1
    return found


def all_blocks() -> Iterator[Block]:
    for page in PAGES:
        yield from blocks(page)


def _joined(lines: list[str], start: int) -> tuple[str, int]:
    """The command starting at lines[start] with its backslash continuation lines; next index."""
    parts = [lines[start]]
    i = start
    while parts[-1].rstrip().endswith("\\") and i + 1 < len(lines):
        i += 1
        parts.append(lines[i])
    return "\n".join(parts), i + 1


def console_commands(body: tuple[str, ...]) -> list[Command]:
    lines = list(body)
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"console block: output before any `$ ` command: {lines[i]!r}")
        lines[i] = lines[i][2:]
        text, i = _joined(lines, i)
        output: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        while output and not output[-1].strip():
            output.pop()
        commands.append(Command(text, tuple(output)))
    return commands


def script_commands(body: tuple[str, ...]) -> list[Command]:
    lines = list(body)
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip() or lines[i].lstrip().startswith("#"):
            i += 1
            continue
        text, i = _joined(lines, i)
        commands.append(Command(text, ()))
    return commands


# -- simple commands in a shell text ---------------------------------------------------------------

SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")
LEADING = {"sudo", "do", "then", "else", "time", "!", "{", "(", "eval"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _split_commands(text: str) -> list[str]:
    """`a | b && c; d` -> [a, b, c, d]: split at ; && || newlines and a pipe standing alone, outside
    quotes and outside [...] (a synopsis's `[--nodes FILE | --shape ...]` stays one command);
    comments dropped."""
    text = text.replace("\\\n", " ")
    parts: list[str] = []
    current: list[str] = []
    quote, depth, i = "", 0, 0
    while i < len(text):
        ch = text[i]
        if not quote and ch == "#" and text[i - 1 : i] in (" ", "\t", "\n", ""):
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
            continue
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and (text.startswith("&&", i) or text.startswith("||", i)):
            parts.append("".join(current))
            current, i = [], i + 2
            continue
        elif depth == 0 and (
            ch in ";\n" or (ch == "|" and text[i - 1 : i] in (" ", "") and text[i + 1 : i + 2] in (" ", ""))
        ):
            parts.append("".join(current))
            current, i = [], i + 1
            continue
        current.append(ch)
        i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def words(command: str) -> list[str]:
    """Shell words of one simple command (comments dropped); whitespace words if it is no valid shell."""
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


def simple_commands(text: str) -> list[list[str]]:
    """The words of every simple command in `text`, command substitutions `$(...)` included, each
    without what only leads a command (sudo, env assignments, `do`, `eval`)."""
    found: list[list[str]] = []
    for inner in SUBSTITUTION.findall(text):
        found.extend(simple_commands(inner))
    for part in _split_commands(SUBSTITUTION.sub("SUBST", text)):
        ws = words(part)
        while ws and (ws[0] in LEADING or ASSIGNMENT.match(ws[0])):
            ws = ws[1:]
        if ws and ws != ["SUBST"]:
            found.append(ws)
    return found


def gpu_operator_invocations(text: str) -> list[list[str]]:
    """The arguments of every `gpu-operator` (or `./dev gpu-operator`) command in `text`."""
    out = []
    for ws in simple_commands(text):
        if ws[0] == "gpu-operator":
            out.append(ws[1:])
        elif ws[:2] == ["./dev", "gpu-operator"]:
            out.append(ws[2:])
    return out


# -- quoted output against real output --------------------------------------------------------------

# What differs between two runs of the same command, and how both sides are written before they
# are compared: times and ages, pids, ports, pod IPs, the random suffixes of generated names.
VOLATILE = [
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\b"), "<time>"),
    (re.compile(r"\b\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4}\b"), "<time>"),
    (re.compile(r"(?<![\w.])\d+(\.\d+)?(ms|s|m|h|d)(\d+(s|m|h))?(?![\w.])"), "<age>"),
    (re.compile(r"\bpid \d+"), "pid <n>"),
    (re.compile(r"\b127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"\b10\.\d+\.\d+\.\d+\b"), "<ip>"),
    (
        re.compile(r"(?<=\w)-(?:[bcdfghjklmnpqrstvwxz2456789]{8,10}-)?[bcdfghjklmnpqrstvwxz2456789]{5}\b"),
        "-<id>",
    ),
]


def normalized(line: str) -> str:
    for pattern, stand_in in VOLATILE:
        line = pattern.sub(stand_in, line)
    return " ".join(line.split())


# A Go library's diagnostic line on stderr (klog's header: severity, date, time, thread, file:line),
# e.g. client-go's reflector inside helm noting that a watch closed: not the command's output, and
# printed or not depending on timing, so a quote never carries one and the comparison drops them.
KLOG = re.compile(r"^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6}\s+\d+ [\w./-]+:\d+\] ")


def quote_problem(quoted: tuple[str, ...] | list[str], real: str) -> str | None:
    """None when the quoted lines are the real output: the same lines in the same order, blank lines
    and runs of spaces aside, `...` standing for any lines (none too), VOLATILE values for any
    value of their kind and KLOG diagnostics left out; otherwise what differs. A quote without a leading or trailing `...` must
    start or end where the output does. An empty quote says nothing about the output."""
    want = [normalized(q) for q in quoted if q.strip()]
    have = [normalized(r) for r in real.splitlines() if r.strip() and not KLOG.match(r)]
    if not want:
        return None
    segments: list[list[str]] = [[]]
    for line in want:
        if line == GAP:
            segments.append([])
        else:
            segments[-1].append(line)
    anchored_start, anchored_end = want[0] != GAP, want[-1] != GAP
    pos = 0
    for n, segment in enumerate(segments):
        if not segment:
            continue
        first = n == 0 and anchored_start
        starts = [pos] if first else range(pos, len(have) - len(segment) + 1)
        at = next((s for s in starts if have[s : s + len(segment)] == segment), None)
        if at is None:
            return f"not in the output{' at its start' if first else ''} (after line {pos}): {segment[0]!r}"
        pos = at + len(segment)
    if anchored_end and pos != len(have):
        return f"the output goes on after the quote: {have[pos]!r}"
    return None
