"""Throw-away PKI for the simulated control plane: a CA, serving and client certificates, SA keys."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=30)

# Each component gets its own user name (all in system:masters) so that the apiserver's audit
# log tells who wrote what: the operator's idle-write count must not include kwok's heartbeats.
CLIENT_IDENTITIES = {
    "admin": "admin",
    "controller-manager": "system:kube-controller-manager",
    "scheduler": "system:kube-scheduler",
    "kwok": "kwok-controller",
    # The operator when run by the simulator or tests with full rights (RBAC tests use a
    # ServiceAccount token instead); its own name lets the audit log single out its writes.
    "operator": "gpu-operator-sim",
}


def _key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys are generated in microseconds, unlike RSA; every component accepts them.
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Pki:
    """Paths of every file the control plane needs; all under one directory."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    def client_cert(self, identity: str) -> Path:
        return self.dir / f"{identity}.crt"

    def client_key(self, identity: str) -> Path:
        return self.dir / f"{identity}.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _builder(subject: x509.Name, issuer: x509.Name, public_key: object) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def generate(directory: Path) -> Pki:
    """Write a CA, the apiserver's serving certificate for 127.0.0.1, client certificates for every
    identity in CLIENT_IDENTITIES and the service-account signing key pair into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)

    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-operator-sim-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common_name: str, orgs: list[str], usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
    ) -> tuple[bytes, bytes]:
        key = _key()
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        builder = _builder(x509.Name(attrs), ca_name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return _pem_cert(builder.sign(ca_key, hashes.SHA256())), _pem_key(key)

    serving = leaf(
        "kube-apiserver",
        [],
        ExtendedKeyUsageOID.SERVER_AUTH,
        [
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.DNSName("kubernetes.default.svc.cluster.local"),
        ],
    )
    clients = {
        identity: leaf(user, ["system:masters"], ExtendedKeyUsageOID.CLIENT_AUTH, [])
        for identity, user in CLIENT_IDENTITIES.items()
    }
    # Service-account tokens: RSA, the algorithm every consumer of them supports.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    files = {
        pki.ca_cert: _pem_cert(ca_cert),
        pki.ca_key: _pem_key(ca_key),
        pki.serving_cert: serving[0],
        pki.serving_key: serving[1],
        pki.sa_key: _pem_key(sa_key),
        pki.sa_pub: sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    for identity, (cert, key) in clients.items():
        files[pki.client_cert(identity)] = cert
        files[pki.client_key(identity)] = key
    for path, data in files.items():
        path.write_bytes(data)
        path.chmod(0o600)
    return pki


def issue_client_cert(pki: Pki, identity: str, user: str, groups: list[str]) -> tuple[Path, Path]:
    """Sign a client certificate for `user` in `groups` with the existing CA (e.g. a real node's
    kubelet: system:node:<name> in system:nodes); written as <identity>.crt/.key next to the rest."""
    return _issue(pki, identity, user, groups, ExtendedKeyUsageOID.CLIENT_AUTH, [])


def issue_serving_cert(
    pki: Pki, identity: str, name: str, ips: list[str], dns: list[str]
) -> tuple[Path, Path]:
    """Sign a serving certificate for these addresses (e.g. a real node's kubelet API, which the
    apiserver verifies against the CA); written as <identity>.crt/.key."""
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    sans += [x509.DNSName(d) for d in dns]
    return _issue(pki, identity, name, [], ExtendedKeyUsageOID.SERVER_AUTH, sans)


def _issue(
    pki: Pki,
    identity: str,
    common_name: str,
    orgs: list[str],
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
) -> tuple[Path, Path]:
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = _key()
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in orgs]
    builder = _builder(x509.Name(attrs), ca_cert.subject, key.public_key()).add_extension(
        x509.ExtendedKeyUsage([usage]), critical=False
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    for path, data in (
        (pki.client_cert(identity), _pem_cert(cert)),
        (pki.client_key(identity), _pem_key(key)),
    ):
        path.write_bytes(data)
        path.chmod(0o600)
    return pki.client_cert(identity), pki.client_key(identity)
