"""`./dev chart`: the charts as a user installs them, into dist/charts/ (no network needed).

- gpu-operator-<version>.tgz: `helm package` of deployments/gpu-operator. When the image was built
  (dist/gpu-operator-<appVersion>.digest, from `./dev image`), the packaged values pin our image
  by that digest (operator, validator and node-status exporter `version: sha256:...`, which the
  chart renders as `repository/image@sha256:...`): the digest of the OCI image as pushed from
  dist/*.oci.tar. Without it, the package names the image by its tag and says so.
- cozy-gpu-operator-<version>.tgz: the platform wrapper (deployments/cozystack/...) with our
  packaged chart as a real dependency in its charts/ (what `helm dependency build` leaves), so it
  installs with no repository at hand.
- index.yaml: `helm repo index` of the directory, with each archive's digest.
- with --sign KEY --keyring SECRING: <archive>.prov next to each archive, Helm's provenance (an
  OpenPGP clear-signed file with the archive's sha256), what `helm install --verify --keyring
  PUBRING` checks, from a chart repository (served next to the archive) and from an OCI registry
  (`helm push` uploads it with the chart).
Both charts are linted (strict); a finding stops the release. Same sources, same bytes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deployments" / "gpu-operator"
WRAPPER = REPO / "deployments" / "cozystack" / "packages" / "system" / "gpu-operator"
PINNED = ("operator", "validator", "nodeStatusExporter")  # the values keys that run our image


class ReleaseError(RuntimeError):
    pass


def _lint(path: Path) -> None:
    report = helm_python.lint(path, strict=True)
    problems = [m["error"] for m in report["messages"]]
    if problems:
        raise ReleaseError(f"helm lint {path.name}: " + "; ".join(problems))


def _pin(chart_copy: Path, digest: str) -> None:
    """Set `version: <digest>` for our image in the copy's values.yaml (a text edit per key, so
    the file keeps its comments)."""
    values_file = chart_copy / "values.yaml"
    lines = values_file.read_text().splitlines(keepends=True)
    for key in PINNED:
        start = next(i for i, line in enumerate(lines) if line.rstrip() == f"{key}:")
        lines.insert(start + 1, f"  version: {digest}  # pinned by ./dev chart: the built image\n")
    values_file.write_text("".join(lines))
    loaded = yaml.safe_load(values_file.read_text())
    assert all(loaded[key]["version"] == digest for key in PINNED), "pinning did not take"


def _epoch() -> int:
    """SOURCE_DATE_EPOCH, else the last commit's time: the one timestamp the archives carry."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    done = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True, check=False
    )
    return int(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else 0


def _settle(tree: Path, epoch: int) -> None:
    """Every file and directory of `tree` timestamped `epoch` (helm package records mtimes)."""
    for path in [*tree.rglob("*"), tree]:
        os.utime(path, (epoch, epoch), follow_symlinks=False)


@dataclass(frozen=True)
class Signer:
    """The OpenPGP key that signs the packages: a name (a unique part of its user id), the secret
    keyring holding it, and a file with its passphrase for a protected key."""

    key: str
    keyring: Path
    passphrase_file: Path | None = None


def _sign(archive: Path, signer: Signer) -> Path:
    try:
        prov = helm_python.sign(
            archive, key=signer.key, keyring=signer.keyring, passphrase_file=signer.passphrase_file
        )
    except helm_python.HelmError as err:
        raise ReleaseError(
            f"--sign {signer.key!r} --keyring {signer.keyring}: {err} (the keyring must be a secret "
            "keyring, e.g. `gpg --export-secret-keys KEY > secring.gpg`; a protected key needs "
            "--passphrase-file)"
        ) from err
    return Path(prov)


def release(out: Path, digest: str | None, log: Any = print, signer: Signer | None = None) -> dict[str, Path]:
    """Write both packages (signed when `signer` is given) and the index into `out`; returns
    {name: archive}."""
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.tgz"), *out.glob("*.tgz.prov")]:
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="gpu-operator-chart-") as tmp:
        ours = Path(tmp) / "gpu-operator"
        shutil.copytree(CHART, ours, ignore=shutil.ignore_patterns("charts", "*.tgz"))
        if digest:
            _pin(ours, digest)
            log(f"chart: our image pinned to {digest}")
        else:
            log(
                f"chart: no dist/gpu-operator-{meta['appVersion']}.digest (run ./dev image): the image is named by tag"
            )
        _lint(ours)
        epoch = _epoch()
        _settle(ours, epoch)
        packaged = Path(helm_python.package(ours, destination=out))
        wrapper = Path(tmp) / "cozy-gpu-operator"
        shutil.copytree(WRAPPER, wrapper, ignore=shutil.ignore_patterns("charts", "*.tgz"))
        (wrapper / "charts").mkdir()
        shutil.copy2(packaged, wrapper / "charts" / packaged.name)
        wrapper_meta = yaml.safe_load((wrapper / "Chart.yaml").read_text())
        (dep,) = wrapper_meta["dependencies"]
        if dep["version"] != meta["version"]:
            raise ReleaseError(
                f"{WRAPPER / 'Chart.yaml'}: depends on gpu-operator {dep['version']}, "
                f"the chart is {meta['version']}: make them equal"
            )
        _lint(wrapper)
        _settle(wrapper, epoch)
        platform = Path(helm_python.package(wrapper, destination=out))
    helm_python.repo_index_generate(out)
    archives = {"gpu-operator": packaged, "cozy-gpu-operator": platform}
    for archive in archives.values():
        log(
            f"chart: {archive.relative_to(out.parent) if out.parent in archive.parents else archive} "
            f"{helm_python.digest(archive)}"
        )
        if signer is not None:
            log(f"chart: signed by {signer.key!r}: {_sign(archive, signer).name}")
    return archives


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist" / "charts", help="output directory")
    parser.add_argument(
        "--digest", help="pin our image to this digest (default: dist/<image>.digest if present)"
    )
    parser.add_argument(
        "--sign", metavar="KEY", help="sign each package with this OpenPGP key (Helm provenance)"
    )
    parser.add_argument("--keyring", type=Path, help="with --sign: the secret keyring holding KEY")
    parser.add_argument("--passphrase-file", type=Path, help="with --sign: a file with the key's passphrase")
    args = parser.parse_args(argv)
    if bool(args.sign) != bool(args.keyring):
        parser.error(
            "--sign KEY and --keyring SECRING go together (e.g. --sign 'Release Team' "
            "--keyring secring.gpg from `gpg --export-secret-keys`)"
        )
    signer = Signer(args.sign, args.keyring, args.passphrase_file) if args.sign else None
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    digest = args.digest
    digest_file = REPO / "dist" / f"gpu-operator-{app_version}.digest"
    if digest is None and digest_file.exists():
        digest = digest_file.read_text().strip()
    if digest is not None and not digest.startswith("sha256:"):
        parser.error(f"--digest {digest!r}: give the image's sha256:<hex> digest")
    try:
        release(args.out, digest, log=lambda m: print(m, file=sys.stderr), signer=signer)
    except ReleaseError as err:
        print(f"chart: {err}", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
