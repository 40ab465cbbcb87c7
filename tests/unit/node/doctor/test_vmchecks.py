"""Doctor's VM checks on the seed-001 fixtures: persistence across reboots, the VFIO IOMMU backend,
KubeVirt's advertised count, and a mixed node's 4 + 4 split (findings and what the probe publishes)."""

from __future__ import annotations

import json

from rich.console import Console
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.node.cluster.publish import probe_facts, publish_once
from gpu_operator.node.doctor.findings import Severity, diagnose
from gpu_operator.node.doctor.report import run
from gpu_operator.node.doctor.vmchecks import Advertised
from gpu_operator.node.host import persist
from gpu_operator.node.host.probe import probe
from gpu_operator.node.vfio import manage as vfio
from gpu_operator.vocabulary import PASSTHROUGH_DEVICES_ANNOTATION, PROBE_FACTS_ANNOTATION, WORKLOAD_CONFIG
from tests.support.hostsim.fakehost import FakeHost
from tests.unit.node.cluster.test_publish import FakeNode
from tests.unit.node.conftest import BuildHost

H100 = [
    "0000:0a:00.0",
    "0000:18:00.0",
    "0000:3b:00.0",
    "0000:44:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b8:00.0",
    "0000:c1:00.0",
]
H100_SXM5 = "nvidia.com/H100_SXM5_80GB"


def codes(findings) -> dict[str, Severity]:  # type: ignore[no-untyped-def]
    return {f.code: f.severity for f in findings}


def test_bound_now_but_not_persisted_until_persist_writes_the_script(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    vfio.execute(host.fs, host.kernel(), "bind", [], True)
    found = {f.code: f for f in diagnose(probe(host.fs), "vm-passthrough")}
    assert found["vfio-not-persistent"].severity == Severity.WARNING
    assert (
        "fall back" in found["vfio-not-persistent"].summary
        and len(found["vfio-not-persistent"].evidence) == 8
    )
    assert "vfio-manage persist --all, then update-initramfs -u -k all" in found["vfio-not-persistent"].fix
    assert codes(diagnose(probe(host.fs), "vm-passthrough"))["host-driver-on-passthrough"] == Severity.ERROR
    persist.persist(host.fs, H100)
    after = codes(diagnose(probe(host.fs), "vm-passthrough"))
    assert "vfio-not-persistent" not in after
    # The loaded host module holds nothing now and nothing at the next boot: a warning, not an error.
    assert after["host-driver-on-passthrough"] == Severity.WARNING


def test_the_seed_hosts_hand_written_script_counts_as_persisted(build_host) -> None:  # type: ignore[no-untyped-def]
    report = probe(build_host("h100-vfio").fs)
    assert sorted(report.persistence.persisted) == H100
    assert not {"vfio-not-persistent", "vfio-iommu-type1-missing"} & set(
        codes(diagnose(report, "vm-passthrough"))
    )


def test_a_missing_vfio_iommu_type1_now_is_an_error_and_at_boot_a_warning(build_host) -> None:  # type: ignore[no-untyped-def]
    unloaded = build_host("h100-vfio", modules=["vfio", "vfio_pci"])
    found = {f.code: f for f in diagnose(probe(unloaded.fs), "vm-passthrough")}
    assert found["vfio-iommu-type1-missing"].severity == Severity.ERROR
    not_at_boot = build_host("h100-vfio")
    not_at_boot.fs.write_text(persist.INITRAMFS_TOOLS_MODULES, "vfio\nvfio_pci\n")
    found = {f.code: f for f in diagnose(probe(not_at_boot.fs), "vm-passthrough")}
    assert found["vfio-iommu-type1-missing"].severity == Severity.WARNING
    assert "vfio, vfio_pci" in found["vfio-iommu-type1-missing"].evidence[0]


def mixed_host(build_host: BuildHost) -> FakeHost:
    host = build_host("h100-nvidia-bound")
    vfio.execute(host.fs, host.kernel(), "bind", H100[:4], False)
    return host


def test_mixed_node_four_plus_four_is_healthy_for_both_stacks(build_host) -> None:  # type: ignore[no-untyped-def]
    host = mixed_host(build_host)
    report = probe(host.fs)
    found = codes(diagnose(report, "vm-passthrough", H100[:4]))
    assert "host-driver-on-passthrough" not in found and "gpu-not-on-vfio" not in found
    assert "gpu-on-vfio-in-container-mode" not in found
    assert found["vfio-not-persistent"] == Severity.WARNING  # bound now, not yet persisted
    fix = {f.code: f for f in diagnose(report, None, H100[:4])}["vfio-not-persistent"].fix
    assert fix.startswith(
        "gpu-operator vfio-manage persist --device 0000:0a:00.0 --device 0000:18:00.0 --device 0000:3b:00.0 --device 0000:44:00.0,"
    )
    # The same host read as all-for-VMs is what it is: four GPUs on the host driver.
    assert found.keys() != codes(diagnose(report, "vm-passthrough")).keys()
    assert codes(diagnose(report, "vm-passthrough"))["gpu-not-on-vfio"] == Severity.ERROR


def test_mixed_node_with_a_listed_gpu_still_on_nvidia_is_an_error(build_host) -> None:  # type: ignore[no-untyped-def]
    host = mixed_host(build_host)
    found = {f.code: f for f in diagnose(probe(host.fs), None, H100[:5])}
    assert found["host-driver-on-passthrough"].severity == Severity.ERROR
    assert found["gpu-not-on-vfio"].evidence == ["0000:87:00.0 (GH100 [H100 SXM5 80GB]) -> nvidia"]
    assert "--device 0000:87:00.0" in found["gpu-not-on-vfio"].fix
    assert (
        codes(diagnose(probe(host.fs), None, ["0000:0a:00.0", "0000:01:00.0"]))["passthrough-device-unknown"]
        == Severity.ERROR
    )


def test_kubevirt_advertising_more_than_are_bound_is_an_error(build_host) -> None:  # type: ignore[no-untyped-def]
    host = mixed_host(build_host)
    console = Console(record=True, width=200)
    code = run(
        probe(host.fs),
        None,
        False,
        console,
        passthrough_devices=H100[:4],
        advertised=[Advertised("10de:2330", H100_SXM5, 8)],
    )
    text = console.export_text()
    assert code == 1
    assert (
        f"KubeVirt advertises 8 GPUs of 10DE:2330 ({H100_SXM5}) on the node but only 4 are bound to vfio-pci"
        in text
    )
    ok = Console(record=True, width=200)
    run(
        probe(host.fs),
        None,
        False,
        ok,
        passthrough_devices=H100[:4],
        advertised=[Advertised("10de:2330", H100_SXM5, 4)],
    )
    assert "kubevirt-advertises-unbound" not in ok.export_text()


def test_doctor_offline_says_what_it_could_not_check_and_takes_counts_on_the_command_line(  # type: ignore[no-untyped-def]
    build_host, monkeypatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    host = mixed_host(build_host)
    root = f"--host-root={host.fs.root}"
    result = CliRunner().invoke(app, ["doctor", root, "--passthrough-devices", ",".join(H100[:4]), "--json"])
    found = {f["code"]: f for f in json.loads(result.output)["findings"]}
    assert "--advertised 10de:2330=N" in found["kubevirt-count-unchecked"]["evidence"][0]
    result = CliRunner().invoke(
        app,
        [
            "doctor",
            root,
            "--passthrough-devices",
            ",".join(H100[:4]),
            "--advertised",
            "10DE:2330=8",
            "--json",
        ],
    )
    assert result.exit_code == 1
    found = {f["code"]: f for f in json.loads(result.output)["findings"]}
    assert "only 4 are bound" in found["kubevirt-advertises-unbound"]["summary"]
    bad = CliRunner().invoke(app, ["doctor", root, "--advertised", "H100=8"])
    assert bad.exit_code == 2 and "VENDOR:DEVICE=COUNT" in bad.output


def test_doctor_with_an_unreachable_api_still_runs(build_host, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    host = build_host("h100-vfio")
    result = CliRunner().invoke(
        app,
        [
            "doctor",
            f"--host-root={host.fs.root}",
            "--node",
            "gpu-7",
            "--json",
            "--workload-config",
            "vm-passthrough",
        ],
    )
    assert result.exit_code == 0, result.output
    found = {f["code"]: f for f in json.loads(result.output)["findings"]}
    assert "could not read Node gpu-7 through the API" in found["kubevirt-count-unchecked"]["evidence"][0]


def test_probe_publishes_gpu_facts_and_judges_a_mixed_node_by_its_annotation(build_host) -> None:  # type: ignore[no-untyped-def]
    host = mixed_host(build_host)
    facts = probe_facts(probe(host.fs))
    assert facts["driverSource"] == "host"
    assert facts["gpus"][0] == {
        "address": "0000:0a:00.0",
        "vendorDevice": "10de:2330",
        "name": "GH100 [H100 SXM5 80GB]",
        "product": "H100 SXM5 80GB",
        "driver": "vfio-pci",
    }
    assert [g["driver"] for g in facts["gpus"]] == ["vfio-pci"] * 4 + ["nvidia"] * 4
    node = FakeNode({WORKLOAD_CONFIG: "vm-passthrough"}, {PASSTHROUGH_DEVICES_ANNOTATION: ",".join(H100[:4])})
    _, events = publish_once(host.fs, node)
    assert "HostDriverOnPassthrough" not in {e["reason"] for e in events}
    assert json.loads(node.published_annotations[0][PROBE_FACTS_ANNOTATION] or "") == facts
    whole = FakeNode({WORKLOAD_CONFIG: "vm-passthrough"})
    _, events = publish_once(host.fs, whole)
    assert "HostDriverOnPassthrough" in {e["reason"] for e in events}


def test_vfio_pci_validation_on_a_mixed_node_checks_only_the_listed_gpus(build_host) -> None:  # type: ignore[no-untyped-def]
    from gpu_operator.node.validate.base import Outcome
    from gpu_operator.node.validate.run import validate
    from tests.unit.node.nodekit import FakeNodeView, context

    host = mixed_host(build_host)
    listed = {PASSTHROUGH_DEVICES_ANNOTATION: ",".join(H100[:4])}
    for labels in ({WORKLOAD_CONFIG: "vm-passthrough"}, {WORKLOAD_CONFIG: "container"}):
        ctx, _ = context(host.fs, kube=FakeNodeView(labels=labels, annotations=listed))
        result = validate(ctx, "vfio-pci")
        assert result.outcome == Outcome.PASSED and "4 GPU(s) on vfio-pci (listed in" in result.message
    one_more = {PASSTHROUGH_DEVICES_ANNOTATION: ",".join(H100[:5])}
    ctx, _ = context(
        host.fs,
        {"WITH_WAIT": "true", "VFIO_PCI_TIMEOUT_SECONDS": "10"},
        kube=FakeNodeView(labels={WORKLOAD_CONFIG: "vm-passthrough"}, annotations=one_more),
    )
    result = validate(ctx, "vfio-pci")
    assert result.outcome == Outcome.FAILED and "0000:87:00.0 -> nvidia" in result.message
    assert "0000:90:00.0" not in result.message
    # Without the list the node is all-for-VMs and the four on nvidia fail it.
    ctx, _ = context(
        host.fs,
        {"WITH_WAIT": "true", "VFIO_PCI_TIMEOUT_SECONDS": "10"},
        kube=FakeNodeView(labels={WORKLOAD_CONFIG: "vm-passthrough"}),
    )
    assert validate(ctx, "vfio-pci").outcome == Outcome.FAILED
