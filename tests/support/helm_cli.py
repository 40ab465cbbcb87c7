"""The helm command line a user runs, Helm 3 or Helm 4, driven with the same arguments for both.

`./dev test` exports both builds (tools/helm/build.sh): GPU_OPERATOR_HELM (v4) and
GPU_OPERATOR_HELM3 (v3). The chart's lifecycle tests take `major` (3 or 4) as a parameter and run
every helm step through `HelmCLI`, whose argument lists are written once: a flag one major does not
take fails the test for that major (docs/helm.md, "Helm 3 and Helm 4")."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

MAJORS = (3, 4)
ENV = {3: "GPU_OPERATOR_HELM3", 4: "GPU_OPERATOR_HELM"}


def helm_binary(major: int) -> str:
    """The helm of that major, as `./dev test` exports it; a clear failure where it is not."""
    found = os.environ.get(ENV[major])
    if not found:
        build = "tools/helm/build.sh" + (" 3" if major == 3 else "")
        pytest.fail(
            f"{ENV[major]} names no helm {major}: ./dev test exports it; by hand: "
            f"export {ENV[major]}=$({build} | tail -n1)"
        )
    return found


class HelmFailed(AssertionError):
    pass


class HelmCLI:
    """`helm ... -n NAMESPACE --kubeconfig ...` with its own config, cache and data directories."""

    def __init__(
        self,
        major: int,
        kubeconfig: Path | str,
        namespace: str,
        home: Path,
        story: Callable[[], str] | None = None,
    ) -> None:
        """`story`: what a failed command's message adds, read at once (the namespace's Jobs,
        pods and Events: tests/support/events.py's namespace_story), so that a hook that never
        finished can be understood from the CI output alone."""
        self.binary, self.namespace, self.major = helm_binary(major), namespace, major
        self.story = story
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str, timeout: int = 240) -> str:
        argv = [self.binary, *args, "--namespace", self.namespace]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=self.env, check=False
        )
        print(
            f"$ helm{self.major} {' '.join(argv[1:])}\n{done.stdout}{done.stderr}"
        )  # shown when a test fails
        if done.returncode != 0:
            told = ""
            if self.story is not None:
                try:
                    told = "\n" + self.story()
                except Exception as err:  # noqa: BLE001 (the story is help, never the failure)
                    told = f"\n(the namespace's story could not be read: {err})"
            raise HelmFailed(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}{told}")
        return done.stdout

    def _values(self, values: dict[str, Any], step: str) -> str:
        file = self.home / f"values-{step}.yaml"
        file.write_text(yaml.safe_dump(values))
        return str(file)

    def install(self, chart: Path, release: str, values: dict[str, Any], *, timeout: int = 180) -> str:
        return self.run(
            "install",
            release,
            str(chart),
            "--create-namespace",
            "-f",
            self._values(values, "install"),
            "--timeout",
            f"{timeout}s",
            timeout=timeout + 60,
        )

    def upgrade(
        self, chart: Path, release: str, values: dict[str, Any], *flags: str, timeout: int = 180
    ) -> str:
        return self.run(
            "upgrade",
            release,
            str(chart),
            "--reuse-values",
            "-f",
            self._values(values, "upgrade"),
            "--timeout",
            f"{timeout}s",
            *flags,
            timeout=timeout + 60,
        )

    def rollback(self, release: str, revision: int, *, timeout: int = 180) -> str:
        return self.run("rollback", release, str(revision), "--timeout", f"{timeout}s", timeout=timeout + 60)

    def uninstall(self, release: str, *, timeout: int = 180) -> str:
        return self.run("uninstall", release, "--timeout", f"{timeout}s", timeout=timeout + 60)

    def history(self, release: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = json.loads(self.run("history", release, "--output", "json"))
        return found

    def releases(self) -> list[str]:
        """The names of every release of the namespace, in any state. The one step whose arguments
        differ: Helm 3 lists deployed and failed releases unless given `--all`; Helm 4 lists every
        state by default and has no `--all` ("unknown flag: --all")."""
        every_state = ["--all"] if self.major == 3 else []
        return [str(r["name"]) for r in json.loads(self.run("list", *every_state, "--output", "json"))]

    def version(self) -> str:
        done = subprocess.run(
            [self.binary, "version", "--template", "{{.Version}}"],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
            check=True,
        )
        return done.stdout.strip()
