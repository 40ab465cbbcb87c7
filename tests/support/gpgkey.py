"""A throw-away OpenPGP signing key for tests of Helm provenance: made by gpg in a GnuPG home of
its own (never the user's), exported as the secret keyring `helm package --sign` reads and the
public keyring `helm verify` / `helm install --verify` read."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    name: str  # the user id's name: what --sign/--key select the key by
    secring: Path
    pubring: Path


def make_key(directory: Path, name: str) -> KeyPair:
    """An unprotected RSA signing key for `name`, valid one day, in `directory`."""
    home = directory / "gnupg"
    home.mkdir(parents=True, mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    params = (
        f"%no-protection\nKey-Type: RSA\nKey-Length: 3072\nKey-Usage: sign\nName-Real: {name}\n"
        "Name-Email: release@gpu-operator.invalid\nExpire-Date: 1d\n%commit\n"
    )
    subprocess.run(
        ["gpg", "--batch", "--quiet", "--gen-key"],
        input=params,
        text=True,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    pair = KeyPair(name, directory / "secring.gpg", directory / "pubring.gpg")
    for args, path in ((["--export-secret-keys"], pair.secring), (["--export"], pair.pubring)):
        path.write_bytes(
            subprocess.run(
                ["gpg", "--batch", *args], env=env, check=True, capture_output=True, timeout=60
            ).stdout
        )
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False, capture_output=True, timeout=30)
    return pair
