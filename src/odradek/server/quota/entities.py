"""Quota entities and Kafka's precedence between them (KIP-55; `ClientQuotaManager`'s default
quota callback). Pure.

An entity is a user, a client id, or a user and a client id together; either part may be the
default (`<default>`, a null name on the wire). Names are kept as ZooKeeper spells them: the user
and client id *sanitized* (`odradek.security.znodes.sanitize`), the default as `<default>`, which
no sanitized name can be (`<` and `>` are escaped).

A client connection (user U, client id C) gets the quota of the most specific entity that has one:

| level | ZooKeeper node | the rate is shared by |
|---|---|---|
| 1 | `/config/users/U/clients/C` | (U, C) |
| 2 | `/config/users/U/clients/<default>` | (U, C) |
| 3 | `/config/users/U` | every client of U |
| 4 | `/config/users/<default>/clients/C` | (U, C) |
| 5 | `/config/users/<default>/clients/<default>` | (U, C) |
| 6 | `/config/users/<default>` | every client of U |
| 7 | `/config/clients/C` | every user of C |
| 8 | `/config/clients/<default>` | every user of C |

"Shared by" is the rate's key (Kafka's metric tags): a user quota bounds the sum over all that
user's client ids, a client-id quota the sum over every user with that client id, and a default
quota applies to each user/client on its own (each gets the whole default, not a share of it).
Each quota type (produce, fetch, request) resolves on its own: a user may have a produce quota at
level 3 and take its fetch quota from level 8.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT = "<default>"
"""ZooKeeper's name for a default entity (Kafka's `ZooKeeperInternals.DEFAULT_STRING`)."""

USER = "user"
CLIENT_ID = "client-id"
"""Entity types, as ClientQuotaEntity names them on the wire."""


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """A user, a client id, or both, as sanitized ZooKeeper names (`DEFAULT` for a default);
    None: the entity has no such part."""

    user: str | None = None
    client_id: str | None = None

    def zk_entity_path(self) -> str:
        """What a config change notification names, and the znode under `/config`:
        `users/U`, `users/U/clients/C` or `clients/C`."""
        if self.user is not None and self.client_id is not None:
            return f"users/{self.user}/clients/{self.client_id}"
        if self.user is not None:
            return f"users/{self.user}"
        if self.client_id is not None:
            return f"clients/{self.client_id}"
        raise ValueError("an empty quota entity")

    @staticmethod
    def from_zk_entity_path(entity_path: str) -> QuotaEntity | None:
        """The entity a notification's `entity_path` names; None for other entity types (topics,
        brokers) or a malformed path."""
        parts = entity_path.split("/")
        if len(parts) == 2 and parts[1]:
            if parts[0] == "users":
                return QuotaEntity(user=parts[1])
            if parts[0] == "clients":
                return QuotaEntity(client_id=parts[1])
        if len(parts) == 4 and parts[0] == "users" and parts[2] == "clients" and parts[1]:
            return QuotaEntity(user=parts[1], client_id=parts[3]) if parts[3] else None
        return None


QuotaKey = tuple[str, str]
"""(user, client id) that a rate is shared by (Kafka's metric tags): "" for a part it is not."""


def resolve(
    overrides: Mapping[QuotaEntity, float], user: str, client_id: str
) -> tuple[QuotaKey, float | None]:
    """The rate key and the bound of a connection of (sanitized) `user` and `client_id` under
    `overrides` (one quota type's configured entities): the most specific level of the table in
    the module docstring; (("", client_id), None) when no level applies."""
    for entity, key in (
        (QuotaEntity(user, client_id), (user, client_id)),
        (QuotaEntity(user, DEFAULT), (user, client_id)),
        (QuotaEntity(user, None), (user, "")),
        (QuotaEntity(DEFAULT, client_id), (user, client_id)),
        (QuotaEntity(DEFAULT, DEFAULT), (user, client_id)),
        (QuotaEntity(DEFAULT, None), (user, "")),
        (QuotaEntity(None, client_id), ("", client_id)),
        (QuotaEntity(None, DEFAULT), ("", client_id)),
    ):
        bound = overrides.get(entity)
        if bound is not None:
            return key, bound
    return ("", client_id), None
