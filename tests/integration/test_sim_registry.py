"""`gpu-operator sim up --registry` as a user runs it: the OCI registry (TLS from the simulator's
CA, basic auth) and the chart repository run detached, recorded for `sim status` and stopped by
`sim down`; a running simulator without a registry is not silently reused for --registry."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from gpu_operator.sim.commands.state import SimState
from tests.integration.test_sim_cli import processes_mentioning, sim


def _get(url: str, ca: str, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=ca), timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_up_with_a_registry_serves_it_and_the_chart_repository_and_down_stops_both(tmp_path: Path) -> None:
    where = tmp_path / "sim"
    plain = sim("up", "--dir", str(where), "--shape", "cpu:1")
    assert plain.returncode == 0, plain.stderr
    try:
        refused = sim("up", "--dir", str(where), "--registry")
        assert refused.returncode == 1
        assert refused.stderr.splitlines()[-1] == (
            f"error: the simulator running in {where} has no registry: stop it first (gpu-operator sim down) and "
            "start it with --registry, or choose another --dir"
        )
    finally:
        assert sim("down", "--dir", str(where)).returncode == 0

    up = sim("up", "--dir", str(where), "--shape", "cpu:1", "--registry")
    assert up.returncode == 0, up.stderr
    try:
        state = SimState.load(where)
        assert state is not None
        assert {"registry", "chart-repo"} <= {p.name for p in state.alive()}
        reg = state.registry
        password = Path(reg["password_file"]).read_text()
        assert _get(f"https://{reg['host']}/v2/", reg["ca"])[0] == 401
        assert _get(f"https://{reg['host']}/v2/", reg["ca"], (reg["user"], "wrong"))[0] == 401
        assert _get(f"https://{reg['host']}/v2/", reg["ca"], (reg["user"], password))[0] == 200
        # the same login as a containers auth file, owner-only (skopeo --authfile: no password on argv)
        auth_file = Path(reg["auth_file"])
        assert auth_file.stat().st_mode & 0o777 == 0o600
        login = base64.b64decode(json.loads(auth_file.read_text())["auths"][reg["host"]]["auth"]).decode()
        assert login == f"{reg['user']}:{password}"
        status, body = _get(f"{reg['chart_repo']}/index.yaml", reg["ca"])
        assert status == 200
        [entry] = yaml.safe_load(body)["entries"]["gpu-operator"]
        assert _get(f"{reg['chart_repo']}/{entry['urls'][0]}", reg["ca"])[0] == 200
    finally:
        down = sim("down", "--dir", str(where))
    assert down.returncode == 0, down.stderr
    assert not any(p.alive for p in state.processes)
    assert processes_mentioning(where) == []
