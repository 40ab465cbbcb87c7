"""CustomResourceDefinitions generated from the pydantic models (structural schemas, CEL rules).

`gpu-operator crds generate` writes them to the package (gpu_operator/api/crds/, applied by the
operator and the Helm hook) and to the Helm chart (deployments/gpu-operator/crds/).
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from pydantic import BaseModel

from gpu_operator.api import computedomain, nodefeature
from gpu_operator.api.crdrow import CRDRow
from gpu_operator.vocabulary import MANAGED_BY, MANAGED_BY_VALUE


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Resolve every $ref (CRD schemas must be self-contained)."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _inline(merged, defs)
    return {key: _inline(value, defs) for key, value in node.items() if key != "$defs"}


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    """Turn pydantic's JSON schema into a Kubernetes structural schema."""
    any_of = node.get("anyOf")
    if any_of is not None:
        options = [option for option in any_of if option.get("type") != "null"]
        extra = {k: v for k, v in node.items() if k not in ("anyOf",)}
        types = sorted(str(option.get("type")) for option in options)
        if types == ["integer", "string"]:
            out: dict[str, Any] = {"x-kubernetes-int-or-string": True}
            if "default" in extra and extra["default"] is not None:
                out["default"] = extra["default"]
            if "description" in extra:
                out["description"] = extra["description"]
            if "x-kubernetes-validations" in extra:
                out["x-kubernetes-validations"] = extra["x-kubernetes-validations"]
            return out
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {types} in a structural schema")
        return _structural({**options[0], **extra})

    out = {}
    if node.get("description"):
        out["description"] = " ".join(str(node["description"]).split())
    if node.get("default") is not None and not isinstance(node.get("default"), dict | list):
        out["default"] = node["default"]
    kind = node.get("type")
    if "enum" in node:
        out["type"] = kind or "string"
        out["enum"] = list(node["enum"])
    elif "const" in node:
        out["type"] = kind or "string"
        out["enum"] = [node["const"]]
    elif kind == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties")
        additional = node.get("additionalProperties")
        if props:
            out["properties"] = {name: _structural(sub) for name, sub in props.items()}
            required = [name for name in node.get("required", []) if name in props]
            if required:
                out["required"] = required
        elif isinstance(additional, dict) and additional:
            out["additionalProperties"] = _structural(additional)
        else:
            # free-form Kubernetes types we pass through (tolerations, affinity, relabelings)
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        out["type"] = "array"
        out["items"] = _structural(node.get("items", {}))
    elif kind is not None:
        out["type"] = kind
    else:
        out["x-kubernetes-preserve-unknown-fields"] = True
    for key in (
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "pattern",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "maxProperties",
        "x-kubernetes-validations",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
    ):
        if key in node:
            out[key] = node[key]
    return out


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(_inline(raw, raw.get("$defs", {})))


def _crd(
    *,
    group: str,
    version: str,
    kind: str,
    plural: str,
    spec_model: type[BaseModel] | None,
    status_model: type[BaseModel] | None,
    short_names: list[str] | None = None,
    columns: list[dict[str, str]],
    rules: list[dict[str, str]] | None = None,
    scope: str = "Cluster",
    body: type[BaseModel] | None = None,
    spec_required: bool = False,
) -> dict[str, Any]:
    """`spec_model`/`status_model` for a spec and a status (subresource); `body` for a kind whose
    fields sit at the top level (no status subresource)."""
    fields = {"spec": schema_of(spec_model)} if spec_model else {}
    if status_model:
        fields["status"] = schema_of(status_model)
    if body:
        fields.update(schema_of(body)["properties"])
    root: dict[str, Any] = {
        "type": "object",
        "description": f"{kind} is the Schema for the {plural} API.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            **fields,
        },
    }
    if spec_required:
        root["required"] = ["spec"]
    if rules:
        root["x-kubernetes-validations"] = rules
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
    }
    if short_names:
        names["shortNames"] = short_names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{group}",
            "labels": {MANAGED_BY: MANAGED_BY_VALUE},
        },
        "spec": {
            "group": group,
            "names": names,
            "scope": scope,
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    **({"subresources": {"status": {}}} if status_model else {}),
                    **({"additionalPrinterColumns": columns} if columns else {}),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


# The modules `ours()` imports by name, for `./dev test --changed` (tools/changed_tests.py: a file
# that names a repository path reads it): a change to a model reaches the CRD tests.
READS = "src/gpu_operator/api"


def ours() -> list[ModuleType]:
    """Our kinds: each module under api/ that sets `CRD` (api/crdrow.py), by module name."""
    import gpu_operator.api as package

    found = [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
        if not info.ispkg and info.name not in ("crdgen", "crdrow")
    ]
    return [m for m in found if isinstance(getattr(m, "CRD", None), CRDRow)]


def crds() -> dict[str, dict[str, Any]]:
    """Every CRD this project defines, keyed by file name (`<group>_<plural>.yaml`): one per kind
    of ours (`ours()`), and NVIDIA's DRA driver's IMEX kinds."""
    columns = {
        "Age": {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        "Status": {"name": "Status", "type": "string", "jsonPath": ".status.state"},
        "Default": {"name": "Default", "type": "boolean", "jsonPath": ".spec.default"},
    }
    out = {}
    for api in ours():
        row: CRDRow = api.CRD
        out[f"{api.GROUP}_{api.PLURAL}.yaml"] = _crd(
            group=api.GROUP,
            version=api.VERSION,
            kind=api.KIND,
            plural=api.PLURAL,
            spec_model=row.spec,
            status_model=row.status,
            short_names=getattr(api, "SHORT_NAMES", None),
            columns=[columns[name] for name in row.columns],
            rules=list(row.rules) or None,
        )
    # NVIDIA's DRA driver's IMEX kinds (the operator ships them, as NVIDIA's chart does)
    cd = computedomain
    out[f"{cd.GROUP}_computedomains.yaml"] = _crd(
        group=cd.GROUP,
        version=cd.VERSION,
        kind="ComputeDomain",
        plural="computedomains",
        spec_model=cd.ComputeDomainSpec,
        status_model=cd.ComputeDomainStatus,
        columns=[],
        scope=cd.SCOPE,
        spec_required=True,
    )
    out[f"{cd.GROUP}_computedomaincliques.yaml"] = _crd(
        group=cd.GROUP,
        version=cd.VERSION,
        kind="ComputeDomainClique",
        plural="computedomaincliques",
        spec_model=None,
        status_model=None,
        columns=[],
        scope=cd.SCOPE,
        body=cd.CliqueBody,
    )
    return out


def node_feature_crd() -> dict[str, Any]:
    """NFD's NodeFeature kind, as far as GFD writes it (api/nodefeature.py). Not among `crds()`: the
    chart does not ship it in crds/ (NFD's chart does, and Helm would then keep whichever came
    first); `gpu-operator crds apply` creates it only where no one has."""
    nf = nodefeature
    crd = _crd(
        group=nf.GROUP,
        version=nf.VERSION,
        kind=nf.KIND,
        plural=nf.PLURAL,
        spec_model=nf.NodeFeatureSpec,
        status_model=None,
        columns=[],
        scope=nf.SCOPE,
        spec_required=True,
    )
    del crd["metadata"]["labels"]  # not ours to manage: whoever installs NFD later may own it
    return crd


HEADER = "# Generated by `gpu-operator crds generate` from gpu_operator.api; do not edit.\n"


def render_yaml(crd: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(crd, sort_keys=False, width=100)


def package_dir() -> Path:
    return Path(str(resources.files("gpu_operator.api").joinpath("crds")))


def chart_dir(repo_root: Path) -> Path:
    return repo_root / "deployments" / "gpu-operator" / "crds"


def write(targets: list[Path]) -> list[Path]:
    """Write every CRD into each target directory; returns the files written."""
    written: list[Path] = []
    for target in targets:
        target.mkdir(parents=True, exist_ok=True)
        for name, crd in crds().items():
            path = target / name
            path.write_text(render_yaml(crd))
            written.append(path)
    return written


def stale(targets: list[Path]) -> list[Path]:
    """Files in the targets that differ from what the models generate now."""
    out: list[Path] = []
    for target in targets:
        for name, crd in crds().items():
            path = target / name
            if not path.is_file() or path.read_text() != render_yaml(crd):
                out.append(path)
    return out


def load_packaged() -> list[dict[str, Any]]:
    """The CRDs shipped in the package (what the operator applies at start-up)."""
    folder = resources.files("gpu_operator.api").joinpath("crds")
    return [yaml.safe_load(folder.joinpath(name).read_text()) for name in sorted(crds())]
