"""Container runtime detection across distributions, and CDI specs."""

from __future__ import annotations

from gpu_operator.node.runtime import cdi_specs, detect_runtime

NVIDIA_V2 = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
"""


def test_rke2_and_its_template(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only", files={
        "/var/lib/rancher/rke2/agent/etc/containerd/config.toml": NVIDIA_V2,
        "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl": "{{ template \"base\" . }}",
        "/run/k3s/containerd/containerd.sock": "",
    })
    rt = detect_runtime(host.fs)
    assert (rt.name, rt.flavor, rt.nvidia_runtime) == ("containerd", "rke2", True)
    assert rt.template_path == "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl"


def test_microk8s(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only", files={"/var/snap/microk8s/current/args/containerd-template.toml": "version = 2\n"})
    assert detect_runtime(host.fs).flavor == "microk8s"


def test_kubelet_endpoint_decides_between_runtimes(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only", files={
        "/etc/containerd/config.toml": "version = 2\n",
        "/etc/crio/crio.conf": '[crio.runtime.runtimes.nvidia]\nruntime_path = "/usr/bin/nvidia-container-runtime"\n',
        "/var/run/crio/crio.sock": "",
        "/var/lib/kubelet/config.yaml": "containerRuntimeEndpoint: unix:///var/run/crio/crio.sock\n",
    })
    rt = detect_runtime(host.fs)
    assert (rt.name, rt.nvidia_runtime, rt.cdi_enabled) == ("crio", True, True)


def test_containerd2_defaults_to_cdi_and_imports_are_read(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only", files={
        "/etc/containerd/config.toml": 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n',
        "/etc/containerd/conf.d/50-nvidia.toml": '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n',
    })
    rt = detect_runtime(host.fs)
    assert rt.cdi_enabled is True and rt.nvidia_runtime
    assert rt.config_files == ["/etc/containerd/config.toml", "/etc/containerd/conf.d/50-nvidia.toml"]


def test_docker_and_a_broken_config(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only", files={"/etc/docker/daemon.json": '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}'})
    host.fs.remove("/etc/containerd/config.toml")
    host.fs.remove("/run/containerd/containerd.sock")
    rt = detect_runtime(host.fs)
    assert (rt.name, rt.nvidia_runtime) == ("docker", True)
    broken = build_host("cpu-only", files={"/etc/containerd/config.toml": "version = = 2"})
    assert detect_runtime(broken.fs).errors and "/etc/containerd/config.toml" in detect_runtime(broken.fs).errors[0]


def test_no_runtime(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only", files={})
    host.fs.remove("/etc/containerd/config.toml")
    host.fs.remove("/run/containerd/containerd.sock")
    assert detect_runtime(host.fs).name == ""


def test_cdi_specs_count_a_linked_directory_once(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("operator-driver", symlinks={"/run/cdi": "/var/run/cdi"})
    host.fs.write_text("/etc/cdi/bad.yaml", "kind: [unclosed\n")
    specs = {s.path: s for s in cdi_specs(host.fs)}
    assert specs["/var/run/cdi/nvidia.com-gpu.yaml"].kind == "nvidia.com/gpu"
    assert specs["/var/run/cdi/nvidia.com-gpu.yaml"].devices == 2
    assert specs["/etc/cdi/bad.yaml"].error
    assert not any(p.startswith("/run/cdi/") for p in specs)
