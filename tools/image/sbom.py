"""Writes the image's SBOM (CycloneDX 1.6 JSON, via cyclonedx-python-lib) from what is really
installed in its root filesystem: dpkg's status database and the Python distributions'
metadata. Deterministic: the serial number derives from the image digest, the timestamp is
SOURCE_DATE_EPOCH's.

    python tools/image/sbom.py --rootfs DIR --name REPO --version TAG --digest sha256:... \
        --created 2026-01-01T00:00:00Z > dist/gpu-operator-TAG.sbom.cdx.json
"""

from __future__ import annotations

import argparse
import email.parser
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from cyclonedx.contrib.license.factories import LicenseFactory
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

SITE_DIRS = ("usr/local/lib/python3.11/dist-packages", "usr/lib/python3/dist-packages")


def dpkg_packages(rootfs: Path) -> Iterator[dict[str, str]]:
    """The installed packages of dpkg's status file, one dict of fields each."""
    text = (rootfs / "var/lib/dpkg/status").read_text()
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and key:
                continue  # continuation lines (descriptions, conffiles)
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if fields.get("Status", "").endswith(" installed"):
            yield fields


def debian_component(fields: dict[str, str], distro: str) -> Component:
    name, version, arch = fields["Package"], fields["Version"], fields.get("Architecture", "all")
    purl = PackageURL(
        type="deb",
        namespace="debian",
        name=name,
        version=version,
        qualifiers={"arch": arch, "distro": distro},
    )
    return Component(
        name=name,
        version=version,
        type=ComponentType.LIBRARY,
        purl=purl,
        bom_ref=purl.to_string(),
        group="debian",
    )


def python_components(rootfs: Path) -> Iterator[Component]:
    factory = LicenseFactory()
    for site in SITE_DIRS:
        for meta_file in sorted((rootfs / site).glob("*.dist-info/METADATA")):
            meta = email.parser.Parser().parsestr(meta_file.read_text(errors="replace"))
            name, version = meta["Name"], meta["Version"]
            purl = PackageURL(type="pypi", name=name.lower().replace("_", "-"), version=version)
            expression = meta.get("License-Expression")
            licenses = [factory.make_from_string(expression)] if expression else []
            yield Component(
                name=name,
                version=version,
                type=ComponentType.LIBRARY,
                purl=purl,
                bom_ref=purl.to_string(),
                licenses=licenses,
            )


def build_bom(rootfs: Path, name: str, version: str, digest: str, created: str) -> Bom:
    os_release = dict(
        line.split("=", 1) for line in (rootfs / "etc/os-release").read_text().splitlines() if "=" in line
    )
    distro = f"{os_release.get('ID', 'debian')}-{os_release.get('VERSION_ID', '').strip(chr(34))}"
    image = Component(
        name=name,
        version=version,
        type=ComponentType.CONTAINER,
        bom_ref=f"{name}@{digest}",
        purl=PackageURL(
            type="oci",
            name=name.rsplit("/", 1)[-1],
            version=digest,
            qualifiers={"repository_url": name, "tag": version},
        ),
    )
    bom = Bom(
        serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"{name}@{digest}"),
        metadata=BomMetaData(
            component=image, timestamp=datetime.fromisoformat(created.replace("Z", "+00:00"))
        ),
    )
    for fields in dpkg_packages(rootfs):
        bom.components.add(debian_component(fields, distro))
    for component in python_components(rootfs):
        bom.components.add(component)
    bom.register_dependency(image, bom.components)
    return bom


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rootfs", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--digest", required=True)
    parser.add_argument("--created", required=True, help="RFC 3339 time, e.g. from SOURCE_DATE_EPOCH")
    args = parser.parse_args()
    bom = build_bom(args.rootfs, args.name, args.version, args.digest, args.created)
    print(JsonV1Dot6(bom).output_as_string(indent=2))


if __name__ == "__main__":
    main()
