"""Attaches our image's SBOM to the image pushed to a registry, as an OCI 1.1 referrer: an artifact
manifest whose ``subject`` is the image's manifest and whose ``artifactType`` is CycloneDX JSON,
with the SBOM file as its one layer (byte for byte). Clients find it with the referrers API
(GET /v2/<name>/referrers/<image digest>), e.g. ``oras discover`` or ``regctl artifact list``.

For a multi-arch index each platform's manifest gets its own SBOM (the one `./dev image` wrote
for that architecture, found next to the index by the manifest digest it pinned).
`tools/chart/push.sh` runs it after `skopeo copy --preserve-digests`, so the digests match.

Usage: attach_sbom.py REGISTRY REPOSITORY ARCHIVE [--ca-file CA] [--creds-file FILE]
  REGISTRY    host[:port][/path], as push.sh takes it
  REPOSITORY  the image's repository under it (gpu-operator-py/gpu-operator)
  ARCHIVE     the OCI archive pushed (dist/gpu-operator-<v>.oci.tar or .index.oci.tar)
Prints one line per SBOM attached: the image manifest digest and the artifact's digest.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import ssl
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"  # the OCI 1.1 empty config of an artifact
SBOM = "application/vnd.cyclonedx+json"  # CycloneDX's registered media type
EMPTY_CONFIG = b"{}"


class PushError(Exception):
    pass


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _archive(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(the layout's top descriptor, the JSON blobs by digest) of an OCI archive."""
    with tarfile.open(path) as tar:
        index_json = tar.extractfile("index.json")
        if index_json is None:
            raise PushError(f"{path}: no index.json (not an OCI archive)")
        top: dict[str, Any] = json.load(index_json)["manifests"][0]
        blobs = {}
        for member in tar.getmembers():
            if member.name.startswith("blobs/sha256/") and member.size < 1 << 20:
                f = tar.extractfile(member)
                if f is not None:
                    blobs["sha256:" + member.name.rsplit("/", 1)[1]] = f.read()
    return top, blobs


def subjects(archive: Path) -> list[tuple[dict[str, Any], Path]]:
    """(the image manifest's descriptor, its SBOM file) for each image in the pushed archive."""
    top, blobs = _archive(archive)
    descriptor = {k: top[k] for k in ("mediaType", "digest", "size")}
    if top["mediaType"] == MANIFEST:
        sbom = archive.with_name(archive.name.removesuffix(".oci.tar") + ".sbom.cdx.json")
        if not sbom.is_file():
            raise PushError(f"{sbom} is missing: `./dev image` writes it beside {archive.name}")
        return [(descriptor, sbom)]
    if top["mediaType"] != INDEX:
        raise PushError(f"{archive}: top descriptor is {top['mediaType']}, want an image manifest or index")
    # the single-architecture archives next to the index, by the manifest digest each holds
    by_digest = {}
    for single in sorted(archive.parent.glob("*.oci.tar")):
        if single != archive and not single.name.endswith(".index.oci.tar"):
            by_digest[_archive(single)[0]["digest"]] = single
    found = []
    for manifest in json.loads(blobs[top["digest"]])["manifests"]:
        pinned = by_digest.get(manifest["digest"])
        if pinned is None:
            raise PushError(
                f"no archive beside {archive} holds {manifest['digest']} ({manifest.get('platform')})"
            )
        found.extend(subjects(pinned))
    return found


def artifact(subject: dict[str, Any], sbom: bytes, filename: str) -> bytes:
    """The referrer manifest of ``sbom`` for ``subject`` (reproducible: no timestamps)."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": SBOM,
        "config": {"mediaType": EMPTY, "digest": _digest(EMPTY_CONFIG), "size": len(EMPTY_CONFIG)},
        "layers": [
            {
                "mediaType": SBOM,
                "digest": _digest(sbom),
                "size": len(sbom),
                "annotations": {"org.opencontainers.image.title": filename},
            }
        ],
        "subject": subject,
    }
    return json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()


class Registry:
    """The few distribution-API calls an artifact push needs, with basic auth or a bearer token
    fetched with the same credentials (what a registry's 401 challenge asks for)."""

    def __init__(self, registry: str, repository: str, ca_file: str | None, creds: str | None) -> None:
        host, _, prefix = registry.partition("/")
        self.base = f"https://{host}"
        self.name = f"{prefix}/{repository}" if prefix else repository
        self.context = ssl.create_default_context(cafile=ca_file)
        self.basic = "Basic " + base64.b64encode(creds.encode()).decode() if creds else None
        self.auth = self.basic

    def request(self, method: str, url: str, body: bytes | None = None, ctype: str | None = None) -> Any:
        url = url if url.startswith("https://") else self.base + url
        for attempt in range(2):
            req = urllib.request.Request(url, data=body, method=method)
            if ctype:
                req.add_header("Content-Type", ctype)
            if self.auth:
                req.add_header("Authorization", self.auth)
            try:
                return urllib.request.urlopen(req, context=self.context, timeout=60)
            except urllib.error.HTTPError as e:
                challenge = e.headers.get("WWW-Authenticate", "")
                if e.code == 401 and attempt == 0 and challenge.startswith("Bearer "):
                    self.auth = "Bearer " + self._token(challenge)
                    continue
                if e.code == 404 and method == "HEAD":
                    return None
                raise PushError(f"{method} {url}: {e.code} {e.read()[:300]!r}") from None
        raise PushError(f"{method} {url}: refused after authenticating")

    def _token(self, challenge: str) -> str:
        params = dict(p.split("=", 1) for p in challenge.removeprefix("Bearer ").split(","))
        params = {k.strip(): v.strip('"') for k, v in params.items()}
        query = {"service": params.get("service", ""), "scope": f"repository:{self.name}:pull,push"}
        req = urllib.request.Request(params["realm"] + "?" + urllib.parse.urlencode(query))
        if self.basic:
            req.add_header("Authorization", self.basic)
        with urllib.request.urlopen(req, context=self.context, timeout=60) as answer:
            token = json.load(answer)
        return str(token.get("token") or token["access_token"])

    def blob(self, data: bytes, ctype: str) -> None:
        digest = _digest(data)
        if self.request("HEAD", f"/v2/{self.name}/blobs/{digest}") is not None:
            return
        started = self.request("POST", f"/v2/{self.name}/blobs/uploads/", b"")
        location = urllib.parse.urljoin(self.base + "/", started.headers["Location"])
        sep = "&" if "?" in location else "?"
        self.request("PUT", f"{location}{sep}digest={digest}", data, "application/octet-stream")

    def manifest(self, data: bytes) -> str:
        digest = _digest(data)
        self.request("PUT", f"/v2/{self.name}/manifests/{digest}", data, MANIFEST)
        return digest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("registry")
    parser.add_argument("repository")
    parser.add_argument("archive", type=Path)
    parser.add_argument("--ca-file")
    parser.add_argument("--creds-file", type=Path)
    args = parser.parse_args(argv)
    creds = args.creds_file.read_text().strip() if args.creds_file else None
    try:
        registry = Registry(args.registry, args.repository, args.ca_file, creds)
        for subject, sbom_file in subjects(args.archive):
            sbom = sbom_file.read_bytes()
            registry.blob(EMPTY_CONFIG, EMPTY)
            registry.blob(sbom, SBOM)
            digest = registry.manifest(artifact(subject, sbom, sbom_file.name))
            print(f"{subject['digest']} {digest}")
    except PushError as e:
        print(f"attach_sbom: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
