import subprocess, yaml, json
from pathlib import Path
from gpu_operator.api.crdgen import crds
from gpu_operator.render import render
from gpu_operator.render.clitext import load_policy, label_gpu_nodes, operator_env
from gpu_operator.render.facts import ClusterFacts
from gpu_operator import shapes

def kubectl(cp, *args, stdin=""):
    return subprocess.run([".venv/bin/kubectl", "--kubeconfig", str(cp.admin_kubeconfig), *args],
                          input=stdin, capture_output=True, text=True)

def test_tmp(control_plane, namespace):
    docs = "---\n".join(yaml.safe_dump(c) for c in crds().values())
    r = kubectl(control_plane, "apply", "--server-side", "-f", "-", stdin=docs)
    print(r.stdout, r.stderr); assert r.returncode == 0
    r = kubectl(control_plane, "wait", "--for=condition=Established", "crd/clusterpolicies.nvidia.com", "crd/nvidiadrivers.nvidia.com", "--timeout=60s")
    assert r.returncode == 0, r.stderr
    for ex in sorted(Path("examples").glob("*.yaml")):
        r = kubectl(control_plane, "apply", "--server-side", "--dry-run=server", "-o", "yaml", "-f", str(ex))
        print(ex, r.returncode, r.stderr[:500]); assert r.returncode == 0
    bad = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: bad}\nspec: {cdi: {enabled: false, nriPluginEnabled: true}}\n"
    r = kubectl(control_plane, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=bad)
    print("bad:", r.stderr); assert r.returncode != 0 and "nriPluginEnabled" in r.stderr
    nd = "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {name: d}\nspec: {default: true, nodeSelector: {a: b}}\n"
    r = kubectl(control_plane, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=nd)
    print("nvd:", r.stderr); assert r.returncode != 0
    nodes = shapes.nodes(["dgx-h100:1"]); label_gpu_nodes(nodes)
    for ex in sorted(Path("examples").glob("*.yaml")):
        facts = ClusterFacts.from_nodes(nodes, namespace=namespace, operator_env={**operator_env(), "VGPU_MANAGER_IMAGE": "r/v:1"})
        result = render(load_policy(ex), facts)
        objs = [o for o in result.objects() if o["kind"] not in ("ServiceMonitor",)]
        r = kubectl(control_plane, "apply", "--server-side", "--dry-run=server", "-f", "-",
                    stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
        print(ex, r.returncode, r.stderr[:2000]); assert r.returncode == 0
