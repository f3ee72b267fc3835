"""Kafka principals: who a connection authenticated as.

A principal is a type and a name, written `Type:name` (Kafka's `KafkaPrincipal.toString`): `User:alice`
after SASL/PLAIN or SCRAM, `User:CN=alice,OU=eng,O=Example,C=US` after mTLS (the certificate's DN,
possibly rewritten by `ssl.principal.mapping.rules`), and `User:ANONYMOUS` on a PLAINTEXT listener or
a TLS connection without a client certificate. Authentication ends with one of these attached to the
connection; authorization compares them by value (type and name, case-sensitive).

Parsing follows Kafka's `SecurityUtils.parseKafkaPrincipal`: split on the first ':' only, so a DN
name keeps its own colons; both parts may be anything else (Kafka does not check the type).
`super.users` is a ';'-separated list of such strings, each trimmed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from odradek.security.errors import SecurityConfigError

USER_TYPE = "User"
WILDCARD_NAME = "*"


@dataclass(frozen=True, slots=True, order=True)
class KafkaPrincipal:
    """A principal type and name; hashable and compared by value."""

    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def user(cls, name: str) -> KafkaPrincipal:
        return cls(USER_TYPE, name)

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """Parse `Type:name` (split on the first ':'); SecurityConfigError if there is no ':'."""
        if not text:
            raise SecurityConfigError(
                "expected a string in format principalType:principalName but got an empty string"
            )
        principal_type, sep, name = text.partition(":")
        if not sep:
            raise SecurityConfigError(
                f"expected a string in format principalType:principalName but got {text!r}"
            )
        return cls(principal_type, name)


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")
# `User:*` in an ACL matches every principal of any type (Kafka's AclEntry.WildcardPrincipal).
WILDCARD_PRINCIPAL = KafkaPrincipal(USER_TYPE, WILDCARD_NAME)


def parse_super_users(value: str | None) -> frozenset[KafkaPrincipal]:
    """`super.users`: `User:admin;User:broker` → the set of principals (empty for None or '')."""
    if not value or not value.strip():
        return frozenset()
    return frozenset(KafkaPrincipal.parse(part.strip()) for part in value.split(";"))


def format_principals(principals: Iterable[KafkaPrincipal]) -> str:
    """The inverse of `parse_super_users`, sorted (for logs and generated configs)."""
    return ";".join(str(p) for p in sorted(principals))
