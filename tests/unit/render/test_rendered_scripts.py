"""Every shell script the renderer puts in a pod (containers' `sh -c` commands, exec probes,
preStop hooks, over every example policy and the everything-on one) run for real under sh, not
read as text: the absolute paths they use are moved under a temporary root, and each program they
call is a stub on PATH that records its argv. Behaviour checked:

- with no status file present, a script that tests for one keeps waiting (it has not ended after
  a while, `sleep` being a stub that returns at once), and never starts its program;
- with every status file present it ends (or execs its program) promptly, exit 0 (a probe: its
  verdict), and the program it starts is the one the contract says the container runs;
- a preStop hook that removes status files removes them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from tools.operand_facts.compare import policies, render_policy
from tools.operand_facts.contract import runs

from gpu_operator.vocabulary import VALIDATIONS_DIR

# Directories scripts reach on the node, moved under the test's root.
MOVED = (
    "/run/nvidia",
    "/host",
    "/sys/module",
    "/usr/local/nvidia",
    "/var/run/cdi",
    "/etc/cdi",
    "/driver-root",
)
BUILTINS = {
    "echo",
    "exit",
    "exec",
    "until",
    "do",
    "done",
    "while",
    "if",
    "then",
    "fi",
    "test",
    "[",
    "true",
    "false",
    "cd",
    "set",
    "export",
    "trap",
    "wait",
    "read",
    "shift",
    ":",
    "break",
    "continue",
    "return",
    "for",
    "in",
    "else",
    "elif",
    "case",
    "esac",
    "printf",
    "kill",
    "command",
    "type",
}


def _scripts() -> dict[str, tuple[str, str]]:
    """id -> (script, the program the container runs by the contract's rule, or '')."""
    found: dict[str, tuple[str, str]] = {}
    for policy in policies().values():
        result = render_policy(policy)
        for state in result.states:
            for obj in state.objects:
                if obj.get("kind") != "DaemonSet":
                    continue
                pod = obj["spec"]["template"]["spec"]
                for ctr in [*pod.get("initContainers", []), *pod["containers"]]:
                    where = f"{obj['metadata']['name']}/{ctr['name']}"
                    words = [*(ctr.get("command") or []), *(ctr.get("args") or [])]
                    if words[:2] == ["sh", "-c"] and len(words) == 3:
                        found[where] = (words[2], runs(ctr))
                    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                        cmd = ((ctr.get(probe) or {}).get("exec") or {}).get("command") or []
                        if cmd[:2] == ["sh", "-c"]:
                            found[f"{where}:{probe}"] = (cmd[2], "")
                    hook = (((ctr.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get(
                        "command"
                    ) or []
                    if hook[:2] == ["sh", "-c"]:
                        found[f"{where}:preStop"] = (hook[2], "")
    return found


SCRIPTS = _scripts()


def _moved(script: str, root: Path) -> str:
    for path in MOVED:
        script = re.sub(rf"(?<![\w/.-]){re.escape(path)}(?=[/\s\"';]|$)", f"{root}{path}", script)
    return script


def _run(script: str, tmp: Path, *, ready: bool, timeout: float = 3.0) -> tuple[int | None, list[list[str]]]:
    """Run under sh with stubs; (exit code or None if still running at `timeout`, stub calls)."""
    root, bin_dir, calls = tmp / "root", tmp / "bin", tmp / "calls"
    validations = root / VALIDATIONS_DIR.lstrip("/")
    validations.mkdir(parents=True, exist_ok=True)
    if ready:
        for name in re.findall(r"[\w.-]*-ready\b|\.[\w-]+-ctr-ready", script):
            (validations / name).write_text("IS_HOST_DRIVER=true\n")
    bin_dir.mkdir(exist_ok=True)
    words = set(re.findall(r"(?<![\w/$.-])([a-z][\w.-]*)", script)) - BUILTINS
    for word in words:
        stub = bin_dir / word
        # sleep returns at once (a short real pause, so a wait loop does not spin)
        pause = "/bin/sleep 0.05\n" if word == "sleep" else ""
        stub.write_text(f'#!/bin/sh\necho "{word} $*" >> {calls}\n{pause}exit 0\n')
        stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp)}
    proc = subprocess.Popen(
        ["sh", "-c", _moved(script, root)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        code: int | None = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        code = None
    made = [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []
    return code, made


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) > 20, sorted(SCRIPTS)
    assert any(":startupProbe" in k for k in SCRIPTS) and any(":preStop" in k for k in SCRIPTS)


@pytest.mark.parametrize("where", sorted(SCRIPTS))
def test_every_rendered_script_parses(where: str) -> None:
    script, _ = SCRIPTS[where]
    done = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, (where, done.stderr)


WAITERS = sorted(w for w, (s, _) in SCRIPTS.items() if re.search(r"until \[ -f [^]]*-ready", s))


def test_wait_scripts_exist() -> None:
    assert len(WAITERS) >= 5, WAITERS


@pytest.mark.parametrize("where", WAITERS)
def test_a_status_file_wait_waits_then_goes_on(where: str, tmp_path: Path) -> None:
    script, program = SCRIPTS[where]
    code, calls = _run(script, tmp_path / "absent", ready=False, timeout=1.5)
    assert code is None, f"{where}: ended ({code}) with no status file: it must wait"
    assert not [c for c in calls if c[0] == program], f"{where}: started {program} before its file was there"
    code, calls = _run(script, tmp_path / "present", ready=True)
    assert code == 0, f"{where}: exit {code} with the status file present"
    if (
        program
        and program not in BUILTINS
        and program != "<image entrypoint>"
        and not program.startswith("/")
    ):
        assert [c for c in calls if c[0] == program], f"{where}: never ran {program}; calls {calls}"


PRESTOPS = sorted(w for w in SCRIPTS if w.endswith(":preStop") and "rm -f" in SCRIPTS[w][0])


@pytest.mark.parametrize("where", PRESTOPS)
def test_a_prestop_hook_removes_the_status_files(where: str, tmp_path: Path) -> None:
    script, _ = SCRIPTS[where]
    validations = tmp_path / "root" / VALIDATIONS_DIR.lstrip("/")
    validations.mkdir(parents=True)
    named = {n for n in re.findall(r"[\w.-]+-ready\b", script) if "*" not in n}
    targets = named | ({"driver-ready", "toolkit-ready"} if "*-ready" in script else set())
    for name in [*targets, "keep-me"]:
        (validations / name).write_text("")
    done = subprocess.run(
        ["sh", "-c", _moved(script, tmp_path / "root")],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    left = {p.name for p in validations.iterdir()}
    assert targets and not targets & left and "keep-me" in left, (where, sorted(left))
