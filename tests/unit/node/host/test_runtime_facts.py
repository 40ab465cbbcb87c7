"""The probe's view of the host's container runtime, as it publishes it for the operator
(`runtime` in the probe-facts annotation: render/distributions.py reads it)."""

from __future__ import annotations

from gpu_operator.node.cluster.publish import probe_facts
from gpu_operator.node.host.probe import probe
from gpu_operator.node.host.runtime import detect_runtime

K3S = "/var/lib/rancher/k3s/agent/etc/containerd"


def test_k0s_and_its_drop_ins(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only",
        files={
            "/etc/k0s/containerd.toml": '# k0s_managed=true\nversion = 2\nimports = ["/run/k0s/containerd-cri.toml"]\n',
            "/etc/k0s/containerd.d/nvidia.toml": '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n',
            "/run/k0s/containerd.sock": "",
        },
    )
    rt = detect_runtime(host.fs)
    assert (rt.flavor, rt.config_path, rt.socket, rt.nvidia_runtime) == (
        "k0s",
        "/etc/k0s/containerd.toml",
        "/run/k0s/containerd.sock",
        True,
    )


def test_published_for_a_k3s_host(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only",
        files={
            f"{K3S}/config.toml": "version = 2\n",
            f"{K3S}/config.toml.tmpl": '{{ template "base" . }}\n',
            "/run/k3s/containerd/containerd.sock": "",
        },
    )
    assert probe_facts(probe(host.fs))["runtime"] == {
        "name": "containerd",
        "flavor": "k3s",
        "config": f"{K3S}/config.toml",
        "template": f"{K3S}/config.toml.tmpl",
        "socket": "/run/k3s/containerd/containerd.sock",
    }


def test_published_for_a_host_without_a_runtime(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only")
    host.fs.remove("/etc/containerd/config.toml")
    host.fs.remove("/run/containerd/containerd.sock")
    assert probe_facts(probe(host.fs))["runtime"] == {"flavor": "none"}


def test_k3s_containerd2_template_is_read_first(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only",
        files={
            f"{K3S}/config.toml": "version = 3\n",
            f"{K3S}/config.toml.tmpl": '{{ template "base" . }}\n',
            f"{K3S}/config-v3.toml.tmpl": '{{ template "base" . }}\n',
        },
    )
    assert detect_runtime(host.fs).template_path == f"{K3S}/config-v3.toml.tmpl"
