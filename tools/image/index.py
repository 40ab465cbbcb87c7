"""Joins single-architecture OCI archives (tools/image/build.sh's outputs) into one multi-arch
OCI archive: every blob of every input, an OCI image index naming each manifest with its
platform, and the layout's index.json pointing at that image index under the tag. Written
byte-for-byte the same from the same inputs (sorted members, fixed owner and mtime), so its
digest is reproducible. `skopeo copy --all oci-archive:<out> docker://...` pushes all of it.

Usage: index.py --tag TAG --mtime EPOCH --out OUT.oci.tar IN.oci.tar [IN.oci.tar ...]
Prints the image index's digest.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    if member is None:
        raise SystemExit(f"{tar.name}: no {name}")
    return member.read()


def _platform(blobs: dict[str, bytes], manifest_digest: str) -> dict[str, str]:
    manifest = json.loads(blobs[manifest_digest])
    config = json.loads(blobs[manifest["config"]["digest"]])
    return {"architecture": config["architecture"], "os": config["os"]}


def join(archives: list[Path], tag: str) -> tuple[dict[str, bytes], bytes]:
    """(every blob by digest, the image index) of the archives' images."""
    blobs: dict[str, bytes] = {}
    manifests: list[dict[str, Any]] = []
    for archive in archives:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.startswith("blobs/sha256/"):
                    blobs["sha256:" + member.name.rsplit("/", 1)[1]] = _read(tar, member.name)
            layout = json.loads(_read(tar, "index.json"))
        for descriptor in layout["manifests"]:
            manifests.append(
                {
                    "mediaType": MANIFEST,
                    "digest": descriptor["digest"],
                    "size": descriptor["size"],
                    "platform": _platform(blobs, descriptor["digest"]),
                }
            )
    arches = [m["platform"]["architecture"] for m in manifests]
    if len(set(arches)) != len(arches):
        raise SystemExit(f"two images for one architecture: {arches}")
    manifests.sort(key=lambda m: m["platform"]["architecture"])
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": manifests,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return blobs, index


def write(out: Path, blobs: dict[str, bytes], index: bytes, tag: str, mtime: int) -> str:
    digest = "sha256:" + hashlib.sha256(index).hexdigest()
    files = {f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()}
    files[f"blobs/sha256/{digest.removeprefix('sha256:')}"] = index
    files["oci-layout"] = b'{"imageLayoutVersion":"1.0.0"}'
    files["index.json"] = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": INDEX,
                    "digest": digest,
                    "size": len(index),
                    "annotations": {"org.opencontainers.image.ref.name": tag},
                }
            ],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(files[name]), mtime, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[name]))
    return digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", required=True)
    parser.add_argument("--mtime", type=int, required=True, help="SOURCE_DATE_EPOCH of the images")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("archives", type=Path, nargs="+")
    args = parser.parse_args()
    blobs, index = join(args.archives, args.tag)
    print(write(args.out, blobs, index, args.tag, args.mtime))


if __name__ == "__main__":
    main()
