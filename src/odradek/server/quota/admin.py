"""What DescribeClientQuotas and AlterClientQuotas do with a request (Kafka 3.9 ZooKeeper mode,
`ZkAdminManager.describeClientQuotas` / `alterClientQuotas`), apart from the wire.

Describe: a filter is a list of components, at most one per entity type, each matching an exact
name, the default, or any name of that type; `strict` leaves out entities that have a part no
component names. The answer is every stored entity with at least one quota key (SCRAM
credentials in the same znode are not quotas) that matches. Errors (INVALID_REQUEST unless said):
a type named twice, an empty type, an unknown match type or an exact match without a name, a
custom type (UNSUPPORTED_VERSION), an `ip` component with a user or client-id one.

Alter, per entry: the entity must be a user, a client id, or a user and a client id (`ip`: refused,
IP connection-rate quotas are not implemented); a name may be null (the default) but not empty;
a set names one of Kafka's four quota keys; `producer_byte_rate` and `consumer_byte_rate` are
longs (a fractional value is INVALID_REQUEST, as Kafka answers), `request_percentage` and
`controller_mutation_rate` doubles. A removal of a key that is not set is fine. Entries fail on
their own; `validate_only` checks without writing.

`controller_mutation_rate` (KIP-599) is stored and described, but not enforced.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from kio.schema.errors import ErrorCode

from odradek.errors import KafkaError
from odradek.security.znodes import desanitize, sanitize
from odradek.server.quota.entities import CLIENT_ID, DEFAULT, USER, QuotaEntity

log = logging.getLogger(__name__)

IP = "ip"
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2
LONG_KEYS = frozenset({"producer_byte_rate", "consumer_byte_rate"})
DOUBLE_KEYS = frozenset({"request_percentage", "controller_mutation_rate"})
QUOTA_KEYS = LONG_KEYS | DOUBLE_KEYS
_ANY = object()  # a component matching any name of its type


def _invalid(message: str) -> KafkaError:
    return KafkaError(message, ErrorCode.invalid_request)


@dataclass(frozen=True, slots=True)
class Component:
    entity_type: str
    match_type: int
    match: str | None


def _filter_matches(
    components: Sequence[Component],
) -> tuple[object | None, object | None, bool]:
    """(user match, client-id match, ip named) where a match is None (no component), `_ANY`, or
    the sanitized name (`DEFAULT` for the default)."""
    found: dict[str, object] = {}
    for component in components:
        entity_type = component.entity_type
        if entity_type == "":
            raise _invalid("Unexpected empty filter component entity type")
        if entity_type not in (USER, CLIENT_ID, IP):
            raise KafkaError(
                f"Custom entity type '{entity_type}' not supported", ErrorCode.unsupported_version
            )
        if entity_type in found:
            word = {USER: "user", CLIENT_ID: "client", IP: "ip"}[entity_type]
            raise _invalid(f"Duplicate {word} filter component entity type")
        if component.match_type == MATCH_EXACT:
            if component.match is None:
                raise _invalid(f"An exact {entity_type} match needs a name")
            found[entity_type] = sanitize(component.match)
        elif component.match_type == MATCH_DEFAULT:
            found[entity_type] = DEFAULT
        elif component.match_type == MATCH_ANY:
            found[entity_type] = _ANY
        else:
            raise _invalid(f"Unexpected match type: {component.match_type}")
    if IP in found and (USER in found or CLIENT_ID in found):
        raise _invalid(
            "Invalid entity filter component combination, IP filter component should not be "
            "used with user or clientId filter component."
        )
    return found.get(USER), found.get(CLIENT_ID), IP in found


def _matches(component: object | None, name: str | None, strict: bool) -> bool:
    if component is None:
        return name is None or not strict
    if component is _ANY:
        return name is not None
    return name == component


def describe(
    configs: Mapping[QuotaEntity, Mapping[str, str]], components: Sequence[Component], strict: bool
) -> list[tuple[QuotaEntity, dict[str, float]]]:
    """The entities of `configs` (every stored entity's config map) that match the filter, with
    their quota values. Raises KafkaError for a bad filter."""
    user, client_id, ip = _filter_matches(components)
    if ip:
        return []  # IP quotas are not stored by this broker
    answer = []
    for entity, config in sorted(configs.items(), key=lambda e: e[0].zk_entity_path()):
        if not (
            _matches(user, entity.user, strict) and _matches(client_id, entity.client_id, strict)
        ):
            continue
        values = {}
        for key, text in config.items():
            if key in QUOTA_KEYS:
                try:
                    values[key] = float(text)
                except ValueError:
                    log.error("ignoring %s=%r of %s", key, text, entity.zk_entity_path())
        if values:
            answer.append((entity, values))
    return answer


def wire_entity(entity: QuotaEntity) -> list[tuple[str, str | None]]:
    """(entity type, name or None for the default) for a response, user first."""
    parts = []
    if entity.user is not None:
        parts.append((USER, None if entity.user == DEFAULT else desanitize(entity.user)))
    if entity.client_id is not None:
        parts.append(
            (CLIENT_ID, None if entity.client_id == DEFAULT else desanitize(entity.client_id))
        )
    return parts


def parse_entity(parts: Iterable[tuple[str, str | None]]) -> QuotaEntity:
    """An AlterClientQuotas entity; KafkaError (INVALID_REQUEST) when it is not one."""
    names: dict[str, str | None] = {}
    for entity_type, name in parts:
        if entity_type not in (USER, CLIENT_ID, IP):
            raise _invalid(f"Unhandled client quota entity type: {entity_type}")
        if name is not None and name == "":
            raise _invalid(f"Empty {entity_type} not supported")
        names[entity_type] = DEFAULT if name is None else sanitize(name)
    if not names:
        raise _invalid("Invalid empty client quota entity")
    if IP in names:
        if len(names) > 1:
            raise _invalid(
                "Invalid quota entity combination, IP entity should not be used with "
                "user/client ID entity."
            )
        raise _invalid("IP connection-rate quotas (connection_creation_rate) are not supported")
    return QuotaEntity(names.get(USER), names.get(CLIENT_ID))


def apply_ops(config: dict[str, str], ops: Iterable[tuple[str, float, bool]]) -> dict[str, str]:
    """`config` after the (key, value, remove) operations; KafkaError for an invalid one."""
    for key, value, remove in ops:
        if remove:
            config.pop(key, None)
            continue
        if key not in QUOTA_KEYS:
            raise _invalid(f"Invalid configuration key {key}")
        if key in LONG_KEYS:
            epsilon = 1e-6
            if not math.isfinite(value):
                raise _invalid(f"Configuration {key} must be a LONG value")
            integral = math.trunc(value + epsilon)  # Kafka: (value + epsilon).toLong
            if abs(integral - value) > epsilon:
                raise _invalid(f"Configuration {key} must be a LONG value")
            config[key] = str(integral)
        else:
            config[key] = java_double_string(value)
    return config


def java_double_string(value: float) -> str:
    """Java's `Double.toString`, which Kafka writes into the znode: `50.0`, `1.0E7`, `1.0E-4`
    (the shortest digits that read back as the same double; scientific outside [1e-3, 1e7))."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    magnitude = abs(value)
    if magnitude == 0 or 1e-3 <= magnitude < 1e7:
        text = repr(value)
        return text if "." in text else f"{text}.0"
    number = Decimal(repr(value))
    digits = "".join(str(d) for d in number.as_tuple().digits).rstrip("0") or "0"
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{number.adjusted()}"
