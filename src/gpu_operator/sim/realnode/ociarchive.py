"""Packs single files into a minimal OCI image archive that `ctr images import` accepts (the real
node's pause image, built from our own Go pause binary: nothing is pulled from a registry)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def layer(files: dict[str, bytes]) -> bytes:
    """An image layer (tar) holding `files` (image path -> content), each executable."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        dirs = sorted(
            {str(parent) for target in files for parent in Path(target.lstrip("/")).parents} - {"."}
        )
        for name in dirs:  # parents first, as a layer lists them
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            layer.addfile(info)
        for target, data in files.items():
            info = tarfile.TarInfo(target.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            layer.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def extend(
    base: Path, out: Path, ref: str, files: dict[str, bytes], created_by: str, user: str | None = None
) -> Path:
    """A docker-archive at `out`: the image of docker-archive `base` plus one layer holding `files`
    (image path -> content, each executable), tagged `ref`, running as `user` if given, else as
    `base` does (deterministic: same base, same bytes)."""
    added = layer(files)
    layer_digest = hashlib.sha256(added).hexdigest()
    with tarfile.open(base) as src:
        manifest = json.load(src.extractfile("manifest.json"))  # type: ignore[arg-type]
        if len(manifest) != 1:
            raise ValueError(f"{base}: expected one image in the archive, found {len(manifest)}")
        entry = manifest[0]
        config = json.load(src.extractfile(entry["Config"]))  # type: ignore[arg-type]
        config["rootfs"]["diff_ids"].append(f"sha256:{layer_digest}")
        config.setdefault("history", []).append({"created_by": created_by})
        if user is not None:
            config.setdefault("config", {})["User"] = user
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
        new_manifest = [
            {"Config": config_name, "RepoTags": [ref], "Layers": [*entry["Layers"], f"{layer_digest}.tar"]}
        ]
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dst:
            for member in src.getmembers():
                if member.name in ("manifest.json", "repositories", entry["Config"]):
                    continue
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
            for name, data in (
                (f"{layer_digest}.tar", added),
                (config_name, config_bytes),
                ("manifest.json", json.dumps(new_manifest).encode()),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                dst.addfile(info, io.BytesIO(data))
    return out


def write_archive(out: Path, ref: str, files: dict[str, Path], entrypoint: list[str]) -> Path:
    """An OCI archive at `out` whose one image (tagged with `ref`'s tag) holds `files` (image path -> host
    file, executable) and runs `entrypoint`."""
    layer_bytes = layer({target: source.read_bytes() for target, source in files.items()})
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer_bytes).hexdigest()}"]},
        }
    ).encode()
    with tarfile.open(out, mode="w") as tar:
        layer_desc = _blob(tar, layer_bytes)
        config_desc = _blob(tar, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}],
            }
        ).encode()
        manifest_desc = _blob(tar, manifest)
        index = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        **manifest_desc,
                        "platform": {"architecture": "amd64", "os": "linux"},
                        # a tag only, as OCI layouts carry it: import with --base-name <repository>
                        "annotations": {"org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1]},
                    }
                ],
            }
        ).encode()
        for name, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out
