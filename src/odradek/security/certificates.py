"""Certificates for a local secure cluster (`odradek cluster up --secure`) and for tests.

`create_local_pki(directory, broker_ids)` writes, as PEM files:

| file | what |
|---|---|
| `ca.pem`, `ca-key.pem` | a self-signed CA (`CN=Odradek local CA`), the truststore of brokers and clients |
| `broker-<id>.pem`, `broker-<id>-key.pem` | per broker: certificate chain (leaf then CA) and key; subject `CN=broker-<id>,OU=brokers,O=Odradek`; SAN `localhost`, `127.0.0.1`, `::1`; usable as server and as client (inter-broker mTLS) |
| `client.pem`, `client-key.pem` | a client certificate, `CN=client,OU=clients,O=Odradek`, for mTLS |

Keys are ECDSA P-256 (fast handshakes, accepted by librdkafka, Java and OpenSSL), written as
unencrypted PKCS#8 with mode 0600, unless a `key_password` is given, in which case they are
encrypted PKCS#8 (Kafka's `ssl.key.password`). Certificates are valid from one hour ago (clock
skew) for `valid_days`.

Kafka settings for these files (broker): `ssl.keystore.type=PEM`,
`ssl.keystore.location=broker-<id>-keystore.pem` — a PEM keystore file holds the key and the chain
in one file, which `keystore_file` also writes — `ssl.truststore.type=PEM`,
`ssl.truststore.location=ca.pem`.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey


@dataclass(frozen=True, slots=True)
class CertificateFiles:
    certificate: Path  # the chain: leaf first, then the CA
    key: Path
    keystore: Path  # key and chain in one PEM file (Kafka's PEM keystore location)


@dataclass(frozen=True, slots=True)
class LocalPki:
    ca_certificate: Path
    ca_key: Path
    brokers: dict[int, CertificateFiles] = field(default_factory=dict)
    client: CertificateFiles | None = None


def _name(common_name: str, unit: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Odradek")]
    if unit:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def create_ca(
    common_name: str = "Odradek local CA", valid_days: int = 825
) -> tuple[x509.Certificate, PrivateKey]:
    key = new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _now() - datetime.timedelta(hours=1)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def issue_certificate(
    ca_certificate: x509.Certificate,
    ca_key: PrivateKey,
    subject: x509.Name,
    *,
    hosts: Iterable[str] = (),
    server: bool = True,
    client: bool = True,
    valid_days: int = 825,
    not_before: datetime.datetime | None = None,
) -> tuple[x509.Certificate, PrivateKey]:
    """A leaf certificate signed by the CA; `hosts` become DNS or IP subject alternative names."""
    key = new_key()
    start = not_before or (_now() - datetime.timedelta(hours=1))
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def certificate_pem(*certificates: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def key_pem(key: PrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def write_certificate_files(
    directory: Path,
    stem: str,
    certificate: x509.Certificate,
    key: PrivateKey,
    ca_certificate: x509.Certificate,
    key_password: str | None = None,
) -> CertificateFiles:
    chain = certificate_pem(certificate, ca_certificate)
    private = key_pem(key, key_password)
    return CertificateFiles(
        certificate=_write(directory / f"{stem}.pem", chain),
        key=_write(directory / f"{stem}-key.pem", private, private=True),
        keystore=_write(directory / f"{stem}-keystore.pem", private + chain, private=True),
    )


def create_local_pki(
    directory: str | os.PathLike[str],
    broker_ids: Iterable[int],
    *,
    hosts: Iterable[str] = ("localhost", "127.0.0.1", "::1"),
    key_password: str | None = None,
    valid_days: int = 825,
) -> LocalPki:
    """Create the CA, one certificate per broker and a client certificate under `directory`."""
    root = Path(directory)
    ca_certificate, ca_key = create_ca(valid_days=valid_days)
    ca_path = _write(root / "ca.pem", certificate_pem(ca_certificate))
    ca_key_path = _write(root / "ca-key.pem", key_pem(ca_key, key_password), private=True)
    hosts = tuple(hosts)
    brokers = {}
    for broker_id in broker_ids:
        certificate, key = issue_certificate(
            ca_certificate,
            ca_key,
            _name(f"broker-{broker_id}", "brokers"),
            hosts=hosts,
            valid_days=valid_days,
        )
        brokers[broker_id] = write_certificate_files(
            root, f"broker-{broker_id}", certificate, key, ca_certificate, key_password
        )
    certificate, key = issue_certificate(
        ca_certificate, ca_key, _name("client", "clients"), server=False, valid_days=valid_days
    )
    client = write_certificate_files(root, "client", certificate, key, ca_certificate, key_password)
    return LocalPki(ca_path, ca_key_path, brokers, client)
