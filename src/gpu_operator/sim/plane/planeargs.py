"""The command lines of the control plane's binaries (etcd, kube-apiserver with its egress
selector and audit policy, kube-controller-manager, kube-scheduler, kwok with its stages and
configuration), and the files they read, written under the control plane's workdir. What runs them
and waits for them is `controlplane.ControlPlane`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpu_operator.sim.plane import pki as pki_mod
from gpu_operator.sim.plane.egress import egress_config
from gpu_operator.sim.plane.processes import free_port

# Users whose writes are not logged by the audit policy: the control plane's own machinery.
QUIET_USERS = [
    "system:kube-controller-manager",
    "system:kube-scheduler",
    "kwok-controller",
    "system:apiserver",
]
READ_VERBS = ("get", "list", "watch")


# kwok plays pod stages (a scheduled pod -> Running and Ready) 4 at a time by default: on a busy
# apiserver (~0.2 s per status patch) that is ~20 pods/s, and with 3,000 nodes 1,700 of 24,000
# operand pods were Ready 200 s after the policy while the DaemonSet controller had created
# 23,000; with 32 at a time 6,100 were Ready at the same point (kwok still at ~0.2 of a core).
# Given a KwokConfiguration, kwok v0.8.0 leaves unset options at zero (its node-lease controller
# then refuses to start), so its other defaults are spelled out.
KWOK_CONFIGURATION = """---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 32
  nodePlayStageParallelism: 16
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enableDebuggingHandlers: true
  enableProfilingHandler: true
  enableContentionProfiling: false
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
"""


def hold_initializing(stages: str) -> str:
    """kwok's stages with its pod-ready stage leaving alone a pod whose Initialized condition is
    False: the kubelet holds such a pod in its init containers (a stand-in of an init container
    says so, `sim/standins/vgpustandin.py`, which writes it Running once they ran through); and
    `READY_AGAIN` added."""
    docs = [d for d in yaml.safe_load_all(stages) if d]
    for doc in docs:
        if doc.get("kind") == "Stage" and (doc.get("metadata") or {}).get("name") == "pod-ready":
            doc["spec"]["selector"]["matchExpressions"].append(
                {
                    "key": '.status.conditions.[] | select( .type == "Initialized" ) | .status',
                    "operator": "NotIn",
                    "values": ["False"],
                }
            )
    return "---\n" + "\n---\n".join(yaml.safe_dump(d, sort_keys=False) for d in [*docs, READY_AGAIN])


# The kubelet's status sync, which kwok's stages lack. When a node's Lease lapses (kwok renews 1,000
# nodes' Leases late on a busy machine), the node lifecycle controller marks the node's pods not
# Ready: the Ready condition alone, ContainersReady untouched (`MarkPodsNotReady`,
# pkg/controller/util/node/controller_utils.go in Kubernetes v1.37.2). A live kubelet writes its
# own view back at its next status sync (its status manager reconciles a pod whose status on the
# apiserver differs from its own); kwok's pod-ready stage matches Pending pods only, so such a pod
# stayed not Ready for good and a 1,000-node rollout never finished (bench/README.md). This stage
# plays that sync: a Running pod whose containers are ready but which is marked not Ready becomes
# Ready again. A pod held in its init containers (ContainersReady False) is not touched.
READY_AGAIN: dict[str, Any] = {
    "apiVersion": "kwok.x-k8s.io/v1alpha1",
    "kind": "Stage",
    "metadata": {"name": "pod-ready-again"},
    "spec": {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
        "selector": {
            "matchExpressions": [
                {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {
                    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                    "operator": "In",
                    "values": ["False"],
                },
                {
                    "key": '.status.conditions.[] | select( .type == "ContainersReady" ) | .status',
                    "operator": "In",
                    "values": ["True"],
                },
            ]
        },
        "next": {
            "statusTemplate": (
                'conditions:\n- lastTransitionTime: {{ Now | Quote }}\n  status: "True"\n  type: Ready\n'
            )
        },
    },
}


def gate_flags(feature_gates: dict[str, bool]) -> list[str]:
    """`--feature-gates` for the apiserver, the controller-manager and the scheduler."""
    if not feature_gates:
        return []
    return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(feature_gates.items()))]


def etcd_argv(etcd: Path, data_dir: Path, url: str, peer: int) -> list[str]:
    return [
        str(etcd),
        "--name=sim",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=sim=http://127.0.0.1:{peer}",
        "--quota-backend-bytes=8589934592",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_argv(
    kube: Path,
    workdir: Path,
    pki: pki_mod.Pki,
    *,
    etcd_url: str,
    port: int,
    egress: Path,
    gates: list[str],
    runtime_config: tuple[str, ...],
    audit_log: Path | None,
) -> list[str]:
    """The apiserver's flags; writes its egress selector (to the proxy listening at `egress`),
    its kubelet client certificate and, with `audit_log`, its audit policy."""
    selector = workdir / "egress-selector.yaml"
    selector.write_text(yaml.safe_dump(egress_config(egress)))
    kubelet_cert, kubelet_key = pki_mod.issue_client_cert(
        pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", []
    )
    args = [
        str(kube),
        "kube-apiserver",
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--service-cluster-ip-range=10.0.0.0/16",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        # The simulator is a single user's machine: no request throttling, so benchmarks
        # measure our operator rather than the apiserver's fairness queues.
        "--max-requests-inflight=0",
        "--max-mutating-requests-inflight=0",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        "--v=1",
        # To the kubelets (logs, exec, port-forward): through the egress proxy, to the node's
        # InternalIP (its name resolves nowhere), verifying its serving certificate.
        f"--egress-selector-config-file={selector}",
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={kubelet_cert}",
        f"--kubelet-client-key={kubelet_key}",
        f"--kubelet-certificate-authority={pki.ca_cert}",
    ]
    args += gates
    if runtime_config:
        args.append(f"--runtime-config={','.join(runtime_config)}")
    if audit_log is not None:
        policy = workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(audit_policy()))
        args += [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ]
    return args


def _common(gates: list[str]) -> list[str]:
    return [
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--kube-api-qps=2000",
        "--kube-api-burst=4000",
        *gates,
    ]


def controller_manager_argv(
    kube: Path,
    kubeconfig: Path,
    pki: pki_mod.Pki,
    gates: list[str],
    *,
    kubernetes: str,
    node_lease_seconds: int,
) -> list[str]:
    return [
        str(kube),
        "kube-controller-manager",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--secure-port={free_port()}",
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.sa_key}",
        "--use-service-account-credentials=false",
        "--cluster-name=sim",
        "--concurrent-gc-syncs=40",
        *_common(gates),
        # The DaemonSet controller's workers are a flag from 1.30 on; the floor keeps its 2.
        *(["--concurrent-daemonset-syncs=10"] if kubernetes == "current" else []),
        *([f"--node-monitor-grace-period={node_lease_seconds + 20}s"] if node_lease_seconds > 40 else []),
    ]


def scheduler_argv(kube: Path, kubeconfig: Path, gates: list[str]) -> list[str]:
    return [
        str(kube),
        "kube-scheduler",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--secure-port={free_port()}",
        *_common(gates),
    ]


def kwok_argv(
    kwok: Path, kubeconfig: Path, workdir: Path, stages_yaml: str, node_lease_seconds: int
) -> list[str]:
    """kwok's flags; writes its stages (`stages_yaml` as `hold_initializing` changes them, with
    `READY_AGAIN`) and
    `KWOK_CONFIGURATION` to one file."""
    stages = workdir / "kwok-stages.yaml"
    stages.write_text(hold_initializing(stages_yaml) + KWOK_CONFIGURATION)
    return [
        str(kwok),
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--config={stages}",
        f"--server-address=127.0.0.1:{free_port()}",
        "--cidr=10.244.0.0/16",
        "--node-ip=10.1.0.1",
        f"--node-lease-duration-seconds={node_lease_seconds}",
    ]


def audit_policy() -> dict[str, Any]:
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "None", "users": QUIET_USERS},
            # Reads by ServiceAccounts (our pods, operator replicas) are kept so a test can read
            # a refusal's status code from responseStatus; everyone else's reads are not.
            {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
            {"level": "Metadata", "userGroups": ["system:serviceaccounts"], "verbs": list(READ_VERBS)},
            {"level": "None", "verbs": list(READ_VERBS)},
            {"level": "Metadata"},
        ],
    }
