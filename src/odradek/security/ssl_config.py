"""`ssl.SSLContext`s from Kafka's `ssl.*` properties, for a listener (server side) and for the
broker's or a tool's connections (client side).

Which properties apply to a listener (`listener_ssl_config`): every `ssl.*` broker property,
overridden key by key by `listener.name.<listener, lower case>.ssl.*`. As in Kafka (KIP-684),
`ssl.client.auth` applies to SASL_SSL listeners only when it is listener-prefixed.

Properties and how they are honoured (defaults are Kafka 3.x's):

| property | meaning here |
|---|---|
| `ssl.keystore.type` (JKS) | PEM or PKCS12; JKS is refused with a one-line error (convert it: `keytool -importkeystore -deststoretype PKCS12`, or use PEM) |
| `ssl.keystore.location` | PEM: one file with the private key and the certificate chain; PKCS12: the store |
| `ssl.keystore.certificate.chain`, `ssl.keystore.key` | PEM only: the chain and the PKCS#8 key inline (then no location) |
| `ssl.keystore.password` | PKCS12 only (Kafka refuses it with PEM) |
| `ssl.key.password` | PEM: decrypts an encrypted PKCS#8 key; PKCS12: the key's password if it differs from the store's |
| `ssl.truststore.type` (JKS) | PEM or PKCS12; JKS refused |
| `ssl.truststore.location`, `ssl.truststore.certificates` | CA certificates (file or inline PEM); without a truststore, the system's CAs |
| `ssl.truststore.password` | PKCS12 only |
| `ssl.client.auth` (none) | server side: none, requested (verify a certificate if sent), required |
| `ssl.enabled.protocols` (TLSv1.2,TLSv1.3) | the range min..max of the listed versions; a list with a gap (TLSv1,TLSv1.2) cannot be expressed in OpenSSL and is refused |
| `ssl.protocol` (TLSv1.3) | validated only: with Java 11+ it does not restrict the negotiated version when `ssl.enabled.protocols` is set, and here it is always set |
| `ssl.cipher.suites` (empty: OpenSSL's defaults) | IANA (Java) names are translated to OpenSSL names (table `JAVA_TO_OPENSSL_CIPHERS`); OpenSSL names are accepted as they are. TLS 1.3 suites cannot be chosen from Python (no SSL_CTX_set_ciphersuites): a list must name all three defaults (TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256, TLS_AES_128_GCM_SHA256) or none, and a list with no TLS 1.3 suite disables TLS 1.3, as it would in Java. CCM suites, export, anonymous, NULL and RC4/3DES suites are not supported |
| `ssl.endpoint.identification.algorithm` (https) | client side: `https` checks the server's host name against its certificate, empty disables the check (the chain is still verified); server side: ignored, as in Kafka |

Files are read when the context is built; rebuilding it is how certificates are reloaded.
Inline or password-protected keys are handed to OpenSSL through a private temporary file holding
the key re-encrypted with a one-time random password, deleted before this returns, so no
unencrypted key ever reaches the disk.
"""

from __future__ import annotations

import os
import secrets
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from odradek.security.errors import SslConfigError

SSL_DEFAULTS: dict[str, str] = {
    "ssl.protocol": "TLSv1.3",
    "ssl.enabled.protocols": "TLSv1.2,TLSv1.3",
    "ssl.keystore.type": "JKS",
    "ssl.truststore.type": "JKS",
    "ssl.client.auth": "none",
    "ssl.endpoint.identification.algorithm": "https",
    "ssl.cipher.suites": "",
}

_PROTOCOLS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
_PROTOCOL_ORDER = ["TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"]
_SSL_PROTOCOL_VALUES = {"TLS", "TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3", "SSL"}

TLS13_DEFAULT_SUITES = frozenset(
    {"TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256"}
)

JAVA_TO_OPENSSL_CIPHERS: dict[str, str] = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA384": "ECDHE-ECDSA-AES256-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384": "ECDHE-RSA-AES256-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256": "DHE-RSA-AES128-GCM-SHA256",
    "TLS_DHE_RSA_WITH_AES_256_GCM_SHA384": "DHE-RSA-AES256-GCM-SHA384",
    "TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "DHE-RSA-CHACHA20-POLY1305",
    "TLS_DHE_RSA_WITH_AES_128_CBC_SHA256": "DHE-RSA-AES128-SHA256",
    "TLS_DHE_RSA_WITH_AES_256_CBC_SHA256": "DHE-RSA-AES256-SHA256",
    "TLS_DHE_RSA_WITH_AES_128_CBC_SHA": "DHE-RSA-AES128-SHA",
    "TLS_DHE_RSA_WITH_AES_256_CBC_SHA": "DHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_256_CBC_SHA256": "AES256-SHA256",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
_SIGNALLING = {"TLS_EMPTY_RENEGOTIATION_INFO_SCSV", "TLS_FALLBACK_SCSV"}


def listener_ssl_config(
    properties: Mapping[str, str], listener_name: str, security_protocol: str | None = None
) -> dict[str, str]:
    """The effective `ssl.*` settings of one listener (defaults filled in)."""
    prefix = f"listener.name.{listener_name.lower()}."
    config = dict(SSL_DEFAULTS)
    config.update({k: v for k, v in properties.items() if k.startswith("ssl.")})
    prefixed = {k[len(prefix) :]: v for k, v in properties.items() if k.startswith(prefix + "ssl.")}
    config.update(prefixed)
    if (security_protocol or "").upper() == "SASL_SSL" and "ssl.client.auth" not in prefixed:
        config["ssl.client.auth"] = "none"
    return config


def _get(config: Mapping[str, str], key: str) -> str:
    return str(config.get(key, SSL_DEFAULTS.get(key, "")) or "").strip()


def _opt(config: Mapping[str, str], key: str) -> str | None:
    value = config.get(key)
    if value is None:
        return None
    value = str(value).strip()
    return value or None


# -- keystores and truststores -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _KeyMaterial:
    key: bytes  # PEM PKCS#8, encrypted with `password`
    chain: bytes  # PEM certificates, leaf first
    password: bytes


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise SslConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None


def _reencrypt(key: object) -> tuple[bytes, bytes]:
    password = secrets.token_urlsafe(24).encode()
    pem = key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password),
    )
    return pem, password


def _pem_key(pem: bytes, key_password: str | None, where: str) -> object:
    try:
        return serialization.load_pem_private_key(
            pem, key_password.encode() if key_password else None
        )
    except TypeError:
        raise SslConfigError(
            f"the private key in {where} is encrypted: set ssl.key.password"
        ) from None
    except ValueError:
        raise SslConfigError(
            f"cannot read the private key in {where} (wrong ssl.key.password, or not a PEM "
            "PKCS#8/PKCS#1/SEC1 key)"
        ) from None


def _pem_certificates(pem: bytes, where: str) -> list[x509.Certificate]:
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise SslConfigError(f"no PEM certificates in {where}") from None
    return certificates


def _keystore(config: Mapping[str, str], required: bool) -> _KeyMaterial | None:
    store_type = _get(config, "ssl.keystore.type").upper()
    location = _opt(config, "ssl.keystore.location")
    inline_chain = _opt(config, "ssl.keystore.certificate.chain")
    inline_key = _opt(config, "ssl.keystore.key")
    store_password = _opt(config, "ssl.keystore.password")
    key_password = _opt(config, "ssl.key.password")
    if inline_chain or inline_key:
        if store_type != "PEM":
            raise SslConfigError(
                "ssl.keystore.key and ssl.keystore.certificate.chain need ssl.keystore.type=PEM"
            )
        if not (inline_chain and inline_key):
            raise SslConfigError(
                "ssl.keystore.key and ssl.keystore.certificate.chain must be set together"
            )
        if location:
            raise SslConfigError("set ssl.keystore.location or the inline PEM keystore, not both")
        if store_password:
            raise SslConfigError(
                "SSL key store password cannot be specified with PEM format, only key password "
                "may be specified."
            )
        key = _pem_key(inline_key.encode(), key_password, "ssl.keystore.key")
        chain = _pem_certificates(inline_chain.encode(), "ssl.keystore.certificate.chain")
        return _material(key, chain)
    if location is None:
        if required:
            raise SslConfigError(
                "an SSL listener needs a keystore: set ssl.keystore.location (or the inline PEM "
                "ssl.keystore.key and ssl.keystore.certificate.chain)"
            )
        return None
    if store_type == "JKS":
        raise SslConfigError(
            f"ssl.keystore.type=JKS is not supported ({location}): use PEM or PKCS12 "
            "(keytool -importkeystore -deststoretype PKCS12)"
        )
    if store_type == "PEM":
        if store_password:
            raise SslConfigError(
                "SSL key store password cannot be specified with PEM format, only key password "
                "may be specified."
            )
        data = _read(location, "ssl.keystore.location")
        key = _pem_key(data, key_password, location)
        return _material(key, _pem_certificates(data, location))
    if store_type == "PKCS12":
        data = _read(location, "ssl.keystore.location")
        password = (key_password or store_password or "").encode() or None
        try:
            key, certificate, extra = pkcs12.load_key_and_certificates(data, password)
        except ValueError:
            raise SslConfigError(
                f"cannot open the PKCS12 keystore {location} (wrong ssl.keystore.password?)"
            ) from None
        if key is None or certificate is None:
            raise SslConfigError(f"the PKCS12 keystore {location} holds no private key entry")
        return _material(key, [certificate, *extra])
    raise SslConfigError(f"unsupported ssl.keystore.type {store_type!r}: use PEM or PKCS12")


def _material(key: object, chain: list[x509.Certificate]) -> _KeyMaterial:
    encrypted, password = _reencrypt(key)
    pem_chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)
    return _KeyMaterial(encrypted, pem_chain, password)


def _truststore(config: Mapping[str, str]) -> str | None:
    """The trusted CAs as PEM text, or None for the system's CAs."""
    store_type = _get(config, "ssl.truststore.type").upper()
    location = _opt(config, "ssl.truststore.location")
    inline = _opt(config, "ssl.truststore.certificates")
    password = _opt(config, "ssl.truststore.password")
    if inline:
        if store_type != "PEM":
            raise SslConfigError("ssl.truststore.certificates needs ssl.truststore.type=PEM")
        if location:
            raise SslConfigError(
                "set ssl.truststore.location or ssl.truststore.certificates, not both"
            )
        if password:
            raise SslConfigError("SSL trust store password cannot be specified for PEM format.")
        certificates = _pem_certificates(inline.encode(), "ssl.truststore.certificates")
    elif location is None:
        return None
    elif store_type == "JKS":
        raise SslConfigError(
            f"ssl.truststore.type=JKS is not supported ({location}): use PEM or PKCS12"
        )
    elif store_type == "PEM":
        if password:
            raise SslConfigError("SSL trust store password cannot be specified for PEM format.")
        certificates = _pem_certificates(_read(location, "ssl.truststore.location"), location)
    elif store_type == "PKCS12":
        data = _read(location, "ssl.truststore.location")
        try:
            loaded = pkcs12.load_pkcs12(data, password.encode() if password else None)
        except ValueError:
            raise SslConfigError(
                f"cannot open the PKCS12 truststore {location} (wrong ssl.truststore.password?)"
            ) from None
        certificates = [c.certificate for c in loaded.additional_certs]
        if loaded.cert is not None:
            certificates.append(loaded.cert.certificate)
        if not certificates:
            raise SslConfigError(f"the PKCS12 truststore {location} holds no certificates")
    else:
        raise SslConfigError(f"unsupported ssl.truststore.type {store_type!r}: use PEM or PKCS12")
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certificates)


def _load_key_material(context: ssl.SSLContext, material: _KeyMaterial) -> None:
    directory = tempfile.mkdtemp(prefix="odradek-tls-")  # mode 0700
    try:
        chain_path = os.path.join(directory, "chain.pem")
        key_path = os.path.join(directory, "key.pem")
        for path, data in ((chain_path, material.chain), (key_path, material.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        try:
            context.load_cert_chain(chain_path, key_path, password=material.password)
        except ssl.SSLError as e:
            raise SslConfigError(
                f"the keystore's key does not match its certificate, or OpenSSL refused it ({e})"
            ) from None
    finally:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def _load_trust(context: ssl.SSLContext, config: Mapping[str, str]) -> None:
    cadata = _truststore(config)
    if cadata is None:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        context.load_verify_locations(cadata=cadata)


# -- protocols and ciphers -----------------------------------------------------------------------


def _protocols(config: Mapping[str, str]) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    protocol = _get(config, "ssl.protocol")
    if protocol not in _SSL_PROTOCOL_VALUES:
        raise SslConfigError(f"unsupported ssl.protocol {protocol!r}")
    names = [p.strip() for p in _get(config, "ssl.enabled.protocols").split(",") if p.strip()]
    if not names:
        raise SslConfigError("ssl.enabled.protocols is empty")
    unknown = [n for n in names if n not in _PROTOCOLS]
    if unknown:
        raise SslConfigError(
            f"unsupported ssl.enabled.protocols {', '.join(unknown)} (supported: "
            f"{', '.join(_PROTOCOL_ORDER)})"
        )
    indexes = sorted({_PROTOCOL_ORDER.index(n) for n in names})
    if indexes != list(range(indexes[0], indexes[-1] + 1)):
        raise SslConfigError(
            f"ssl.enabled.protocols {','.join(names)} has a gap, which OpenSSL cannot express"
        )
    return _PROTOCOLS[_PROTOCOL_ORDER[indexes[0]]], _PROTOCOLS[_PROTOCOL_ORDER[indexes[-1]]]


def openssl_cipher_list(suites: str) -> tuple[str | None, bool]:
    """`ssl.cipher.suites` → (OpenSSL cipher list for TLS ≤ 1.2 or None for the defaults,
    whether TLS 1.3 stays enabled). SslConfigError names any suite that is not supported."""
    names = [s.strip() for s in suites.split(",") if s.strip()]
    if not names:
        return None, True
    tls13 = {n for n in names if n.startswith("TLS_AES_") or n.startswith("TLS_CHACHA20_")}
    unsupported = sorted(tls13 - TLS13_DEFAULT_SUITES)
    if unsupported:
        raise SslConfigError(f"unsupported TLS 1.3 cipher suites: {', '.join(unsupported)}")
    if tls13 and tls13 != TLS13_DEFAULT_SUITES:
        raise SslConfigError(
            "TLS 1.3 cipher suites cannot be restricted here: list all of "
            f"{', '.join(sorted(TLS13_DEFAULT_SUITES))} or none (none disables TLS 1.3)"
        )
    openssl: list[str] = []
    for name in names:
        if name in tls13 or name in _SIGNALLING:
            continue
        if name.startswith("TLS_") or name.startswith("SSL_"):
            mapped = JAVA_TO_OPENSSL_CIPHERS.get(name)
            if mapped is None:
                raise SslConfigError(f"unsupported cipher suite {name}")
            openssl.append(mapped)
        else:
            openssl.append(name)  # already an OpenSSL name
    return (":".join(openssl) if openssl else None), bool(tls13)


def _apply_protocols_and_ciphers(context: ssl.SSLContext, config: Mapping[str, str]) -> None:
    minimum, maximum = _protocols(config)
    cipher_list, tls13 = openssl_cipher_list(_get(config, "ssl.cipher.suites"))
    if not tls13 and maximum is ssl.TLSVersion.TLSv1_3:
        maximum = ssl.TLSVersion.TLSv1_2
        if minimum > maximum:
            raise SslConfigError(
                "ssl.cipher.suites has no TLS 1.3 suite but ssl.enabled.protocols is only TLSv1.3"
            )
    if minimum < ssl.TLSVersion.TLSv1_2:
        # OpenSSL 3 refuses TLS < 1.2 at its default security level; level 0 allows it.
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.minimum_version = minimum
    context.maximum_version = maximum
    if cipher_list is not None:
        try:
            context.set_ciphers(cipher_list)
        except ssl.SSLError:
            raise SslConfigError(
                f"OpenSSL supports none of ssl.cipher.suites ({cipher_list})"
            ) from None


# -- contexts ------------------------------------------------------------------------------------


def server_context(config: Mapping[str, str]) -> ssl.SSLContext:
    """The context of a listener (`config` from `listener_ssl_config`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _apply_protocols_and_ciphers(context, config)
    material = _keystore(config, required=True)
    if material is not None:
        _load_key_material(context, material)
    client_auth = _get(config, "ssl.client.auth").lower()
    if client_auth not in ("none", "requested", "required"):
        raise SslConfigError(
            f"invalid ssl.client.auth {client_auth!r}: none, requested or required"
        )
    if client_auth == "none":
        context.verify_mode = ssl.CERT_NONE
    else:
        _load_trust(context, config)
        context.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
    return context


def client_context(config: Mapping[str, str]) -> ssl.SSLContext:
    """The context of an outgoing connection (inter-broker, tools, tests)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _apply_protocols_and_ciphers(context, config)
    algorithm = _get(config, "ssl.endpoint.identification.algorithm").lower()
    if algorithm not in ("https", ""):
        raise SslConfigError(
            f"unsupported ssl.endpoint.identification.algorithm {algorithm!r}: https or empty"
        )
    context.check_hostname = algorithm == "https"
    context.verify_mode = ssl.CERT_REQUIRED
    _load_trust(context, config)
    material = _keystore(config, required=False)
    if material is not None:
        _load_key_material(context, material)
    return context
