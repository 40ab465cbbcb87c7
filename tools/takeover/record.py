"""Record the state NVIDIA's operator leaves on a cluster, for the take-over tests.

Runs NVIDIA's gpu-operator binary (built from its source outside this repository, see
tests/fixtures/nvidia-v26.7.0/README.md) against a fresh simulator with a few kwok GPU nodes,
waits until its operands run, and writes what it created into a fixture directory:

- `objects.yaml`: every object owned (ownerReferences) by its ClusterPolicy or NVIDIADriver:
  DaemonSets, ServiceAccounts, Roles/Bindings, ClusterRoles/Bindings, RuntimeClasses,
  ConfigMaps, Services, ... with the fields the server sets stripped;
- `policy.yaml`: the ClusterPolicy (and NVIDIADriver) with their status;
- `nodes.yaml`: per node, its shape and the `nvidia.com/` labels and annotations on it.

Nothing of NVIDIA's code is written: only the API objects its operator wrote. The operator's
namespace is recorded as the token NAMESPACE_TOKEN, owner uids as OWNER_UID_TOKEN-KIND-NAME and
the hash of an NVIDIADriver's uid in its driver DaemonSets' names as OWNER_HASH_TOKEN-NAME; the
tests put their own namespace, uids and hashes in their place.

Usage (from the repository root):
    .venv/bin/python -m tools.takeover.record --operator /tmp/peer/gpu-operator \
        --crds /tmp/peer/src/deployments/gpu-operator/crds --policy POLICY.yaml \
        --out tests/fixtures/nvidia-v26.7.0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client, KubeConfig
from lightkube.codecs import load_all_yaml

from gpu_operator.render.nvidiadriver import name_hash
from gpu_operator.sim.plane import binaries, nodes
from gpu_operator.sim.plane.controlplane import ControlPlane, free_port
from gpu_operator.sim.standins import roster

NAMESPACE = "gpu-operator-recorded"  # distinctive: replaced as a token, anywhere in a string
NAMESPACE_TOKEN = "@NAMESPACE@"
OWNER_UID_TOKEN = "@UID@"
OWNER_HASH_TOKEN = "@UIDHASH@-NVIDIADriver"  # + "-<name>": the hash of that NVIDIADriver's uid

# What NVIDIA's operator creates (its state manifests under assets/), by API path.
KINDS: list[tuple[str, str, bool]] = [
    ("/apis/apps/v1", "daemonsets", True),
    ("/apis/apps/v1", "deployments", True),
    ("/api/v1", "serviceaccounts", True),
    ("/api/v1", "configmaps", True),
    ("/api/v1", "services", True),
    ("/api/v1", "secrets", True),
    ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    ("/apis/node.k8s.io/v1", "runtimeclasses", False),
    ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    ("/apis/policy/v1", "poddisruptionbudgets", True),
]
SERVER_SET = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink")
SERVER_SET_ANNOTATIONS = ("deprecated.daemonset.template.generation",)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tokenized(value: Any, hashes: dict[str, str] | None = None) -> Any:
    """The namespace, and each NVIDIADriver's uid hash (`hashes`: hash -> token), as tokens."""
    if isinstance(value, str):
        value = value.replace(NAMESPACE, NAMESPACE_TOKEN)
        for digest, token in (hashes or {}).items():
            value = value.replace(digest, token)
        return value
    if isinstance(value, list):
        return [tokenized(v, hashes) for v in value]
    if isinstance(value, dict):
        return {k: tokenized(v, hashes) for k, v in value.items()}
    return value


def stripped(
    obj: dict[str, Any],
    owners: dict[str, str],
    keep_status: bool = False,
    hashes: dict[str, str] | None = None,
) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    meta = obj["metadata"]
    for key in SERVER_SET:
        meta.pop(key, None)
    annotations = meta.get("annotations") or {}
    for key in SERVER_SET_ANNOTATIONS:
        annotations.pop(key, None)
    if not annotations:
        meta.pop("annotations", None)
    for ref in meta.get("ownerReferences") or []:
        ref["uid"] = owners.get(ref["uid"], ref["uid"])
    if not keep_status:
        obj.pop("status", None)
    if obj.get("kind") == "Service":
        spec = obj.get("spec") or {}
        for key in ("clusterIP", "clusterIPs"):
            spec.pop(key, None)
    result: dict[str, Any] = tokenized(obj, hashes)
    return result


def kinded(item: dict[str, Any], api: str, plural: str, kind_of: dict[str, str]) -> dict[str, Any]:
    item.setdefault("apiVersion", api.removeprefix("/apis/").removeprefix("/api/"))
    item.setdefault("kind", kind_of[plural])
    return item


KIND_OF = {
    "daemonsets": "DaemonSet",
    "deployments": "Deployment",
    "serviceaccounts": "ServiceAccount",
    "configmaps": "ConfigMap",
    "services": "Service",
    "secrets": "Secret",
    "roles": "Role",
    "rolebindings": "RoleBinding",
    "clusterroles": "ClusterRole",
    "clusterrolebindings": "ClusterRoleBinding",
    "runtimeclasses": "RuntimeClass",
    "priorityclasses": "PriorityClass",
    "poddisruptionbudgets": "PodDisruptionBudget",
}


def dump(plane: ControlPlane, out: Path, shapes_of: dict[str, str]) -> dict[str, int]:
    crs: list[dict[str, Any]] = []
    for version, plural, kind in (
        ("v1", "clusterpolicies", "ClusterPolicy"),
        ("v1alpha1", "nvidiadrivers", "NVIDIADriver"),
    ):
        for item in plane.request("GET", f"/apis/nvidia.com/{version}/{plural}")["items"]:
            crs.append({"apiVersion": f"nvidia.com/{version}", "kind": kind, **item})
    owners = {cr["metadata"]["uid"]: f"{OWNER_UID_TOKEN}-{cr['kind']}-{cr['metadata']['name']}" for cr in crs}
    # NVIDIA names an NVIDIADriver's driver DaemonSets by a hash of the CR's uid (upstream
    # internal/state/driver.go getDriverAppName); ours computes the same hash (render/nvidiadriver.py
    # name_hash). It is written as a token, so the loader fills in the hash of the test's uid.
    hashes = {
        name_hash(cr["metadata"]["uid"]): f"{OWNER_HASH_TOKEN}-{cr['metadata']['name']}"
        for cr in crs
        if cr["kind"] == "NVIDIADriver"
    }
    objects: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for api, plural, namespaced in KINDS:
        path = f"{api}/namespaces/{NAMESPACE}/{plural}" if namespaced else f"{api}/{plural}"
        for item in plane.request("GET", path)["items"]:
            refs = item["metadata"].get("ownerReferences") or []
            if not any(ref.get("uid") in owners for ref in refs):
                continue
            objects.append(stripped(kinded(item, api, plural, KIND_OF), owners, hashes=hashes))
            counts[KIND_OF[plural]] = counts.get(KIND_OF[plural], 0) + 1
    objects.sort(key=lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]))
    node_records = []
    for node in plane.request("GET", "/api/v1/nodes")["items"]:
        meta = node["metadata"]
        node_records.append(
            {
                "name": meta["name"],
                "shape": shapes_of.get(meta["name"], ""),
                "labels": {k: v for k, v in sorted((meta.get("labels") or {}).items()) if "nvidia.com/" in k},
                "annotations": {
                    k: v for k, v in sorted((meta.get("annotations") or {}).items()) if "nvidia.com/" in k
                },
            }
        )

    def write(name: str, docs: list[dict[str, Any]]) -> None:
        (out / name).write_text(yaml.safe_dump_all(docs, sort_keys=True, default_flow_style=False))

    write("policy.yaml", [stripped(cr, owners, keep_status=True, hashes=hashes) for cr in crs])
    for token in hashes.values():
        named = [o["metadata"]["name"] for o in objects if token in o["metadata"]["name"]]
        say(f"{token}: in the names of {named}")
    write("objects.yaml", objects)
    write("nodes.yaml", node_records)
    return counts


def settled(plane: ControlPlane) -> tuple[bool, str]:
    policies = plane.request("GET", "/apis/nvidia.com/v1/clusterpolicies")["items"]
    state = ((policies[0].get("status") or {}).get("state")) if policies else None
    sets = plane.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")["items"]
    short = [
        d["metadata"]["name"]
        for d in sets
        if (d.get("status") or {}).get("numberReady", 0)
        < (d.get("status") or {}).get("desiredNumberScheduled", 0)
    ]
    upgrade = [
        n["metadata"]["name"]
        for n in plane.request("GET", "/api/v1/nodes")["items"]
        if "nvidia.com/gpu-driver-upgrade-state" not in (n["metadata"].get("labels") or {})
    ]
    drivers = {
        d["metadata"]["name"]: (d.get("status") or {}).get("state")
        for d in plane.request("GET", "/apis/nvidia.com/v1alpha1/nvidiadrivers")["items"]
    }
    what = f"policy state {state}, {len(sets)} DaemonSets ({len(short)} not ready), no upgrade state on {upgrade}"
    if drivers:
        what += f", NVIDIADriver states {drivers}"
    drivers_ready = all(s == "ready" for s in drivers.values())
    return state == "ready" and drivers_ready and sets != [] and not short and not upgrade, what


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--operator", type=Path, required=True, help="NVIDIA's gpu-operator binary")
    parser.add_argument("--crds", type=Path, required=True, help="its chart's crds/ directory")
    parser.add_argument(
        "--policy", type=Path, required=True, help="YAML with the ClusterPolicy (and NVIDIADriver) to create"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        help="NAME=VALUE for the operator's environment "
        "(as its chart's Deployment sets: DRIVER_MANAGER_IMAGE, VALIDATOR_IMAGE)",
    )
    parser.add_argument("--shape", action="append", default=[], help="node shapes (default dgx-h100:3)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=420)
    args = parser.parse_args()
    shapes_spec = args.shape or ["dgx-h100:3"]
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="takeover-record-"))
    plane = ControlPlane(workdir, binaries.locate(build=False), progress=lambda m: say(f"control plane: {m}"))
    plane.start()
    peer: subprocess.Popen[bytes] | None = None
    try:
        config = KubeConfig.from_file(plane.admin_kubeconfig)
        client = Client(config, field_manager="takeover-record")
        names = nodes.add_nodes(client, shapes_spec)
        nodes.wait_ready(client, names)
        shapes_of: dict[str, str] = {}
        for spec in shapes_spec:
            shape, _, count = spec.partition(":")
            for _ in range(int(count or 1)):
                shapes_of[names[len(shapes_of)]] = shape
        for path in sorted(args.crds.glob("*.yaml")):
            for obj in load_all_yaml(path.read_text()):
                client.apply(obj, force=True)
        time.sleep(2)  # the CRDs' Established condition; the create below retries anyway
        kubeconfig = plane.serviceaccount_kubeconfig(NAMESPACE, "gpu-operator")
        plane.request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "takeover-record-operator"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "gpu-operator", "namespace": NAMESPACE}],
            },
        )
        plurals = {"ClusterPolicy": "v1/clusterpolicies", "NVIDIADriver": "v1alpha1/nvidiadrivers"}
        for obj in yaml.safe_load_all(args.policy.read_text()):
            if not obj:
                continue
            for attempt in range(30):
                try:
                    plane.request("POST", f"/apis/nvidia.com/{plurals[obj['kind']]}", obj)
                    break
                except urllib.error.HTTPError as err:  # the CRD not served yet
                    if attempt == 29:
                        raise
                    say(f"create {obj['kind']}: {err}; again")
                    time.sleep(1)
        with roster.running(config):
            env = {
                **os.environ,
                "OPERATOR_NAMESPACE": NAMESPACE,
                "WATCH_NAMESPACE": "",
                **dict(e.split("=", 1) for e in args.env),
            }
            log = (args.out / "operator.log").open("wb")
            peer = subprocess.Popen(
                [
                    str(args.operator),
                    f"--kubeconfig={kubeconfig}",
                    f"--metrics-bind-address=127.0.0.1:{free_port()}",
                    f"--health-probe-bind-address=127.0.0.1:{free_port()}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            say(f"NVIDIA's operator started (pid {peer.pid}), log {args.out / 'operator.log'}")
            deadline = time.monotonic() + args.timeout
            ok, what = False, ""
            while time.monotonic() < deadline:
                if peer.poll() is not None:
                    raise SystemExit(f"NVIDIA's operator exited with {peer.returncode}; see its log")
                ok, what = settled(plane)
                if ok:
                    break
                time.sleep(3)
            say(("settled: " if ok else "NOT settled: ") + what)
            time.sleep(5)  # a last status write
            counts = dump(plane, args.out, shapes_of)
            say(f"recorded {sum(counts.values())} objects: {counts}")
            return 0 if ok else 1
    finally:
        if peer is not None and peer.poll() is None:
            peer.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                peer.wait(20)
            if peer.poll() is None:
                peer.kill()
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
