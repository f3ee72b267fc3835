"""SCRAM credentials (RFC 5802, RFC 7677) in Kafka's formats.

A stored credential is what the server needs to verify a password without knowing it:

    SaltedPassword = Hi(password, salt, i)          Hi = PBKDF2 with HMAC-H (RFC 5802 §2.2)
    ClientKey      = HMAC(SaltedPassword, "Client Key")
    StoredKey      = H(ClientKey)
    ServerKey      = HMAC(SaltedPassword, "Server Key")

with H = SHA-256 for SCRAM-SHA-256 and SHA-512 for SCRAM-SHA-512. The password is used as its
UTF-8 bytes without SASLprep, as Kafka's `ScramFormatter.normalize` does.

Kafka's string form (`ScramCredentialUtils.credentialToString`), stored in `/config/users/<user>`
under the mechanism name:

    salt=<base64>,stored_key=<base64>,server_key=<base64>,iterations=<int>

Parsing accepts the four keys in any order and nothing else. Iterations: at least 4096 (Kafka's
`ScramMechanism.minIterations`: the server refuses to authenticate with fewer); AlterUserScram-
Credentials also caps them at 16384 (`maxIterations`).

`kafka-configs.sh --alter --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret]'`
is parsed by `parse_add_config` (Kafka's ConfigCommand rules: split on commas outside brackets,
then on the first `=` outside brackets, then delete every `[` and `]`) and turned into a stored
credential by `credential_from_config_value` (`(iterations=N,)?password=...`, iterations default
4096).
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from odradek.security.errors import InvalidScramCredentialError

DEFAULT_ITERATIONS = 4096


class ScramMechanism(enum.Enum):
    """Value: (mechanism name, hashlib name, wire code in AlterUserScramCredentials)."""

    SCRAM_SHA_256 = ("SCRAM-SHA-256", "sha256", 1)
    SCRAM_SHA_512 = ("SCRAM-SHA-512", "sha512", 2)

    @property
    def mechanism_name(self) -> str:
        return self.value[0]

    @property
    def hash_name(self) -> str:
        return self.value[1]

    @property
    def code(self) -> int:
        return self.value[2]

    @property
    def min_iterations(self) -> int:
        return 4096

    @property
    def max_iterations(self) -> int:
        return 16384

    @classmethod
    def from_name(cls, name: str) -> ScramMechanism | None:
        for mechanism in cls:
            if mechanism.mechanism_name == name:
                return mechanism
        return None

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode("utf-8"), salt, iterations)

    def client_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Client Key")

    def server_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Server Key")


SCRAM_MECHANISM_NAMES = frozenset(m.mechanism_name for m in ScramMechanism)


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:  # never print key material
        return f"ScramCredential(iterations={self.iterations})"

    def to_string(self) -> str:
        b64 = base64.b64encode
        return (
            f"salt={b64(self.salt).decode()},stored_key={b64(self.stored_key).decode()},"
            f"server_key={b64(self.server_key).decode()},iterations={self.iterations}"
        )

    @classmethod
    def from_string(cls, text: str) -> ScramCredential:
        fields: dict[str, str] = {}
        for token in text.split(","):
            key, sep, value = token.partition("=")
            if not sep or not key:
                raise InvalidScramCredentialError("Credentials not valid: malformed field")
            fields[key] = value
        if set(fields) != {"salt", "stored_key", "server_key", "iterations"}:
            raise InvalidScramCredentialError(
                "Credentials not valid: expected salt, stored_key, server_key and iterations"
            )
        try:
            return cls(
                base64.b64decode(fields["salt"], validate=True),
                base64.b64decode(fields["stored_key"], validate=True),
                base64.b64decode(fields["server_key"], validate=True),
                int(fields["iterations"]),
            )
        except (binascii.Error, ValueError):
            raise InvalidScramCredentialError(
                "Credentials not valid: bad base64 or iterations"
            ) from None


def generate_credential(
    mechanism: ScramMechanism,
    password: str,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
) -> ScramCredential:
    """A new credential with a random 32-byte salt (unless given)."""
    if iterations < mechanism.min_iterations:
        raise InvalidScramCredentialError(
            f"Iterations {iterations} is less than the minimum {mechanism.min_iterations} "
            f"required for {mechanism.mechanism_name}"
        )
    salt = secrets.token_bytes(32) if salt is None else salt
    salted = mechanism.salted_password(password, salt, iterations)
    return ScramCredential(
        salt, mechanism.hash(mechanism.client_key(salted)), mechanism.server_key(salted), iterations
    )


_OUTSIDE_BRACKETS = r"(?=[^\]]*(?:\[|$))"
_ADD_CONFIG_SPLIT = re.compile("," + _OUTSIDE_BRACKETS)
_KEY_VALUE_SPLIT = re.compile(r"\s*=\s*" + _OUTSIDE_BRACKETS)
_SCRAM_VALUE = re.compile(r"(?:iterations=(-?[0-9]*),)?password=(.*)", re.DOTALL)


def parse_add_config(value: str) -> dict[str, str]:
    """`kafka-configs.sh --add-config` syntax: `a=1,SCRAM-SHA-256=[iterations=8192,password=x]`.

    As Kafka: brackets group commas; every `[` and `]` is then deleted from the value (so a
    password cannot contain them) and keys and values are trimmed."""
    result: dict[str, str] = {}
    for item in _ADD_CONFIG_SPLIT.split(value):
        parts = _KEY_VALUE_SPLIT.split(item)
        if len(parts) != 2:
            raise InvalidScramCredentialError(
                'Invalid entity config: all configs to be added must be in the format "key=val".'
            )
        result[parts[0].strip()] = parts[1].replace("[", "").replace("]", "").strip()
    return result


def credential_from_config_value(
    mechanism: ScramMechanism, value: str, salt: bytes | None = None
) -> ScramCredential:
    """`iterations=8192,password=alice-secret` (or `password=...` alone: 4096 iterations; -1 also
    means the default, as ConfigCommand's AdminClient path accepts) → a new stored credential."""
    match = _SCRAM_VALUE.fullmatch(value)
    if match is None:
        raise InvalidScramCredentialError(
            f"Invalid credential property {mechanism.mechanism_name}=<redacted>"
        )
    iterations_text, password = match.groups()
    iterations = (
        int(iterations_text) if iterations_text not in (None, "", "-1") else DEFAULT_ITERATIONS
    )
    return generate_credential(mechanism, password, iterations, salt)


def scram_configs_from_add_config(value: str) -> dict[str, str]:
    """The whole `--add-config` value → the user znode's config entries, with each SCRAM
    mechanism's `[iterations=..,password=..]` replaced by its stored credential string."""
    configs = parse_add_config(value)
    for name, raw in list(configs.items()):
        mechanism = ScramMechanism.from_name(name)
        if mechanism is not None:
            configs[name] = credential_from_config_value(mechanism, raw).to_string()
    return configs
