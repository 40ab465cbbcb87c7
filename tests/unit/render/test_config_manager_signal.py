"""The config-manager sidecar can signal its process: NVIDIA's config-manager (k8s-device-plugin
v0.20.0 cmd/config-manager/main.go `findPidToSignal`) sends SIGNAL to the first process it can see
whose argv[0] equals PROCESS_TO_SIGNAL, so each pod shares its process namespace (or the host's)
and its main container's process starts with exactly that argv[0]."""

from __future__ import annotations

import shlex

from gpu_operator.vocabulary import PLUGIN_CONFIG_HASH
from tests.unit.render.renderkit import ctr, daemonset, env_of, run


def test_each_sidecar_sees_and_names_its_process() -> None:
    result = run({"devicePlugin": {"config": {"name": "time-slicing", "default": "any"}}})
    scripts = {
        o["metadata"]["name"]: o["data"] for s in result.states for o in s.objects if o["kind"] == "ConfigMap"
    }
    for state, main in (
        ("state-device-plugin", "nvidia-device-plugin"),
        ("gpu-feature-discovery", "gpu-feature-discovery"),
        ("state-mps-control-daemon", "mps-control-daemon-ctr"),
    ):
        ds = daemonset(result, state)
        pod = ds["spec"]["template"]["spec"]
        assert pod.get("shareProcessNamespace") or pod.get("hostPID"), state
        argv0 = ctr(ds, main)["command"][0]
        if argv0 == "/bin/entrypoint.sh":  # the device plugin's entrypoint execs the plugin
            text = scripts["nvidia-device-plugin-entrypoint"]["entrypoint.sh"]
            argv0 = next(shlex.split(line)[1] for line in text.splitlines() if line.startswith("exec "))
        assert env_of(ctr(ds, "config-manager"))["PROCESS_TO_SIGNAL"] == argv0, state


PLUGINS = ("state-device-plugin", "gpu-feature-discovery", "state-mps-control-daemon")


def test_the_configs_hash_is_on_each_plugins_pod_template_so_an_edit_rolls_them() -> None:
    # config-manager re-links the file only on a label change: a new hash restarts the pods, which read it afresh
    spec = {"devicePlugin": {"config": {"name": "time-slicing", "default": "any"}}}
    first, edited = run(spec, plugin_config_hash="aaaa"), run(spec, plugin_config_hash="bbbb")
    for state in PLUGINS:
        assert (
            daemonset(first, state)["spec"]["template"]["metadata"]["annotations"][PLUGIN_CONFIG_HASH]
            == "aaaa"
        )
        assert (
            daemonset(edited, state)["spec"]["template"]["metadata"]["annotations"][PLUGIN_CONFIG_HASH]
            == "bbbb"
        )


def test_no_hash_without_a_named_config_or_before_it_was_read() -> None:
    for spec, known in (({}, "aaaa"), ({"devicePlugin": {"config": {"name": "time-slicing"}}}, "")):
        result = run(spec, plugin_config_hash=known)
        for state in PLUGINS:
            template = daemonset(result, state)["spec"]["template"]
            assert PLUGIN_CONFIG_HASH not in (template.get("metadata") or {}).get("annotations", {}), state
