"""Container runtime detection across distributions, and CDI specs."""

from __future__ import annotations

from gpu_operator.node.host.runtime import cdi_specs, detect_runtime

NVIDIA_V2 = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
"""


def test_rke2_and_its_template(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only",
        files={
            "/var/lib/rancher/rke2/agent/etc/containerd/config.toml": NVIDIA_V2,
            "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl": '{{ template "base" . }}',
            "/run/k3s/containerd/containerd.sock": "",
        },
    )
    rt = detect_runtime(host.fs)
    assert (rt.name, rt.flavor, rt.nvidia_runtime) == ("containerd", "rke2", True)
    assert rt.template_path == "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl"


def test_microk8s(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only", files={"/var/snap/microk8s/current/args/containerd-template.toml": "version = 2\n"}
    )
    assert detect_runtime(host.fs).flavor == "microk8s"


def test_kubelet_endpoint_decides_between_runtimes(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only",
        files={
            "/etc/containerd/config.toml": "version = 2\n",
            "/etc/crio/crio.conf": '[crio.runtime.runtimes.nvidia]\nruntime_path = "/usr/bin/nvidia-container-runtime"\n',
            "/var/run/crio/crio.sock": "",
            "/var/lib/kubelet/config.yaml": "containerRuntimeEndpoint: unix:///var/run/crio/crio.sock\n",
        },
    )
    rt = detect_runtime(host.fs)
    assert (rt.name, rt.nvidia_runtime, rt.cdi_enabled) == ("crio", True, True)


def test_containerd2_defaults_to_cdi_and_imports_are_read(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only",
        files={
            "/etc/containerd/config.toml": 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n',
            "/etc/containerd/conf.d/50-nvidia.toml": '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n',
        },
    )
    rt = detect_runtime(host.fs)
    assert rt.cdi_enabled is True and rt.nvidia_runtime
    assert rt.config_files == ["/etc/containerd/config.toml", "/etc/containerd/conf.d/50-nvidia.toml"]


def test_docker_and_a_broken_config(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only",
        files={"/etc/docker/daemon.json": '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}'},
    )
    host.fs.remove("/etc/containerd/config.toml")
    host.fs.remove("/run/containerd/containerd.sock")
    rt = detect_runtime(host.fs)
    assert (rt.name, rt.nvidia_runtime) == ("docker", True)
    broken = build_host("cpu-only", files={"/etc/containerd/config.toml": "version = = 2"})
    assert (
        detect_runtime(broken.fs).errors
        and "/etc/containerd/config.toml" in detect_runtime(broken.fs).errors[0]
    )


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


def test_crio_reads_its_config_then_every_drop_in_in_lexical_order(build_host) -> None:  # type: ignore[no-untyped-def]
    """CRI-O's precedence: /etc/crio/crio.conf, then each file below crio.conf.d in lexical order
    (subdirectories walked in place), the later one winning; the reader's default runtime is the
    last one set."""
    host = build_host(
        "cpu-only",
        files={
            "/etc/crio/crio.conf": '[crio.runtime]\ndefault_runtime = "crun"\n',
            "/etc/crio/crio.conf.d/99-nvidia.conf": '[crio.runtime]\ndefault_runtime = "nvidia"\n'
            '[crio.runtime.runtimes.nvidia]\nruntime_path = "/x"\n',
            "/etc/crio/crio.conf.d/10-crio.conf": '[crio.runtime]\ndefault_runtime = "runc"\n',
            "/etc/crio/crio.conf.d/50-site/01.conf": '[crio.runtime]\ndefault_runtime = "kata"\n',
            "/var/run/crio/crio.sock": "",
        },
    )
    rt = detect_runtime(host.fs)
    assert rt.config_files == [
        "/etc/crio/crio.conf",
        "/etc/crio/crio.conf.d/10-crio.conf",
        "/etc/crio/crio.conf.d/50-site/01.conf",
        "/etc/crio/crio.conf.d/99-nvidia.conf",
    ]
    assert (rt.name, rt.nvidia_runtime, rt.default_runtime) == ("crio", True, "nvidia")


def test_crio_with_drop_ins_only(build_host) -> None:  # type: ignore[no-untyped-def]
    """Packages may ship no crio.conf: the drop-ins alone say it is CRI-O (no socket needed)."""
    host = build_host(
        "cpu-only", files={"/etc/crio/crio.conf.d/10-crio.conf": '[crio.runtime]\ndefault_runtime = "crun"\n'}
    )
    rt = detect_runtime(host.fs)
    assert (rt.name, rt.config_files, rt.default_runtime, rt.nvidia_runtime) == (
        "crio",
        ["/etc/crio/crio.conf.d/10-crio.conf"],
        "crun",
        False,
    )


HOOK = '{"version": "1.0.0", "hook": {"path": "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook"}, "stages": ["prestart"]}'


def test_crio_hook_in_its_hooks_dir(build_host) -> None:  # type: ignore[no-untyped-def]
    """The toolkit's hook mode: an OCI hook in CRI-O's hooks_dir (default /usr/share/containers/oci/hooks.d,
    or what its config sets); a hook elsewhere is not CRI-O's."""
    files = {
        "/etc/crio/crio.conf": "[crio.runtime]\n",
        "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json": HOOK,
    }
    rt = detect_runtime(build_host("cpu-only", files=files).fs)
    assert (rt.nvidia_hook, rt.nvidia_runtime) == (
        "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json",
        False,
    )
    files["/etc/crio/crio.conf.d/01-hooks.conf"] = (
        '[crio.runtime]\nhooks_dir = ["/run/containers/oci/hooks.d"]\n'
    )
    assert detect_runtime(build_host("cpu-only", files=files).fs).nvidia_hook is None
