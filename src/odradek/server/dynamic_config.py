"""Dynamic broker configs (KIP-226): which configs change without a restart, their precedence,
their validation, and the synonyms DescribeConfigs lists (Kafka's DynamicBrokerConfig).

Dynamic configs are stored in ZooKeeper at two levels: `/config/brokers/<id>` (one broker;
AlterConfigs with resource name = the broker id, sent to that broker) and `/config/brokers/<default>`
(every broker; resource name ""). A broker's effective value of a config comes from, in order:

1. DYNAMIC_BROKER_CONFIG: `/config/brokers/<id>`;
2. DYNAMIC_DEFAULT_BROKER_CONFIG: `/config/brokers/<default>`;
3. STATIC_BROKER_CONFIG: server.properties and `--override`;
4. DEFAULT_CONFIG: Kafka's default (`odradek.server.config.DEFINITIONS`).

As in Kafka, a config set at a higher level removes its synonyms from the levels below it: a
dynamic `log.retention.ms` replaces a static `log.retention.hours`. Topic overrides (`/config/topics/<topic>`) still win over all four for their topic.

The configs Odradek applies at run time (`DYNAMIC_CONFIGS`; `odradek.server.dynamic_config_manager`
does it on every broker when the change notification arrives):

| configs | what changes |
|---|---|
| the broker defaults of topic configs (`LOG_CONFIGS`: `message.max.bytes`, `log.retention.ms`, `log.retention.bytes`, `log.segment.bytes`, `log.roll.ms`, `log.cleanup.policy`, `min.insync.replicas`, `compression.type`, ...) and `producer.id.expiration.ms` | the config of every log of a topic without its own override |
| `unclean.leader.election.enable` | the controller's default for topics without an override; turned on, it elects leaders for offline partitions at once |
| `log.cleaner.threads`, `.dedupe.buffer.size`, `.io.buffer.size`, `.io.buffer.load.factor`, `.io.max.bytes.per.second`, `.backoff.ms` | the log cleaner restarts its threads with them (cleanings in progress resume later from their checkpoints) |
| `num.replica.fetchers` | followers' partitions move to the fetchers of the new count |
| `max.connections`, `max.connections.per.ip`, `max.connections.per.ip.overrides`, `listener.name.<l>.max.connections` | the limits new connections are checked against (connections already open stay) |
| per broker only: `listener.name.<l>.ssl.keystore.location`/`.type`, `.ssl.truststore.location`/`.type` | the TLS listener's context, for new connections (validated by building it) |

Anything else is refused with INVALID_REQUEST, as Kafka 3.9 refuses a broker config it cannot
change (its ConfigAdminManager turns every validation failure of a BROKER resource into
INVALID_REQUEST, KAFKA-13609): `Cannot update these configs dynamically: Set(broker.id)`. Unlike
Kafka, which stores unknown names as custom configs, Odradek refuses names it does not implement,
so that nobody believes a setting took effect; and TLS passwords (Kafka keeps them encrypted with
`password.encoder.secret`, which Odradek does not implement: `Password encoder secret not
configured`). Thread counts follow Kafka's rule: at least 1, at
least half and at most double the current value.

Concurrency: the broker's event loop only.
"""

from __future__ import annotations

import copy
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from odradek.errors import ConfigError, InvalidRequestError, InvariantError, KafkaError
from odradek.log.log_cleaner import CleanerConfig
from odradek.network.quotas import parse_overrides
from odradek.security.errors import SecurityConfigError
from odradek.security.ssl_config import listener_ssl_config, server_context
from odradek.server.admin.topics import log_config_for
from odradek.server.config import DEFINITIONS, KafkaConfig, convert_value, derive_values

log = logging.getLogger(__name__)

# Kafka's ConfigEntry.ConfigSource ids (DescribeConfigs `config_source` and synonym `source`).
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
DYNAMIC_BROKER_LOGGER_CONFIG = 6

DEFAULT_ENTITY = "<default>"

TOPIC_CONFIG_SYNONYMS = {
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "segment.index.bytes": "log.index.size.max.bytes",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "max.message.bytes": "message.max.bytes",
    "index.interval.bytes": "log.index.interval.bytes",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "cleanup.policy": "log.cleanup.policy",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "min.insync.replicas": "min.insync.replicas",
    "compression.type": "compression.type",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.difference.max.ms": "log.message.timestamp.difference.max.ms",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
}
"""Each topic config's broker default (Kafka's ServerTopicConfigSynonyms, for what Odradek has)."""

LOG_CONFIGS = frozenset({*TOPIC_CONFIG_SYNONYMS.values(), "producer.id.expiration.ms"})
"""Kafka's DynamicLogConfig (the broker names of topic configs: only the first of each group of
synonyms, so `log.retention.ms` is dynamic but `log.retention.hours` is not, as in Kafka) and
producer.id.expiration.ms."""

CLEANER_CONFIGS = frozenset(
    {
        "log.cleaner.threads",
        "log.cleaner.dedupe.buffer.size",
        "log.cleaner.io.buffer.load.factor",
        "log.cleaner.io.buffer.size",
        "log.cleaner.io.max.bytes.per.second",
        "log.cleaner.backoff.ms",
        "log.cleaner.nice",  # Odradek's own: the cleaner processes' CPU priority
    }
)
FETCHER_CONFIGS = frozenset({"num.replica.fetchers"})
CONNECTION_CONFIGS = frozenset(
    {"max.connections", "max.connections.per.ip", "max.connections.per.ip.overrides"}
)
THROTTLE_CONFIGS = frozenset(
    {"leader.replication.throttled.rate", "follower.replication.throttled.rate"}
)
"""Replication throttles (KIP-73; Kafka's QuotaConfigs.brokerQuotaConfigs): broker configs of
these two levels only (no static or default value), validated here as non-negative longs and
applied by the replication quota component, which follows the same znodes."""
DYNAMIC_CONFIGS = (
    LOG_CONFIGS | CLEANER_CONFIGS | FETCHER_CONFIGS | CONNECTION_CONFIGS | THROTTLE_CONFIGS
)

_LISTENER_CONFIG = re.compile(r"listener\.name\.([^.]*)\.(.*)")
CLUSTER_LISTENER_CONFIGS = frozenset({"max.connections"})
"""Base names a `listener.name.<l>.` prefix may carry dynamically, cluster-wide too."""
SSL_FILE_CONFIGS = frozenset(
    {
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.truststore.type",
        "ssl.truststore.location",
    }
)
"""Keystore and truststore files of a TLS listener: per broker, with the listener prefix."""
SSL_PASSWORD_CONFIGS = frozenset(
    {
        "ssl.keystore.password",
        "ssl.key.password",
        "ssl.truststore.password",
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
        "ssl.truststore.certificates",
    }
)
"""Kafka's other reconfigurable SSL configs: passwords (PASSWORD type), which Kafka stores
encrypted with `password.encoder.secret`; Odradek has no password encoder and refuses them."""

_UNLIMITED = 2147483647
_THREAD_COUNTS = ("log.cleaner.threads", "num.replica.fetchers")
_TIME_SYNONYMS = (
    ("log.roll.ms", "log.roll.hours"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
)
_LISTS = frozenset({"log.cleanup.policy"})
_SENSITIVE_SUFFIXES = ("password", "sasl.jaas.config", "ssl.keystore.key")


def config_synonyms(name: str, match_listener_override: bool = True) -> list[str]:
    """Kafka's `brokerConfigSynonyms`: the names one config may be given by, highest precedence
    first (`log.roll.ms` before `log.roll.hours`; a listener override before its base name)."""
    for group in _TIME_SYNONYMS:
        if name in group:
            return list(group)
    match = _LISTENER_CONFIG.fullmatch(name)
    if match and match_listener_override:
        return [name, match.group(2)]
    return [name]


def is_sensitive(name: str) -> bool:
    """Passwords, keys and JAAS configs: DescribeConfigs shows them as null. As in Kafka, a
    property that is not a declared config is sensitive too (its type is unknown)."""
    base = _base_name(name)
    if base.endswith(_SENSITIVE_SUFFIXES):
        return True
    return not is_declared(base)


def is_declared(name: str) -> bool:
    """Is `name` a broker config Odradek knows (whether or not it may change at run time)?"""
    return name in DEFINITIONS or name in THROTTLE_CONFIGS or name.startswith(("ssl.", "sasl."))


def is_dynamic(name: str) -> bool:
    match = _LISTENER_CONFIG.fullmatch(name)
    if match:
        return match.group(2) in CLUSTER_LISTENER_CONFIGS | SSL_FILE_CONFIGS
    return name in DYNAMIC_CONFIGS


def listener_ssl_names(names: Iterable[str]) -> set[str]:
    """The per-broker listener SSL configs among `names`."""
    return {
        n for n in names if (m := _LISTENER_CONFIG.fullmatch(n)) and m.group(2) in SSL_FILE_CONFIGS
    }


def is_list_config(name: str) -> bool:
    return _base_name(name) in _LISTS


def _base_name(name: str) -> str:
    match = _LISTENER_CONFIG.fullmatch(name)
    return match.group(2) if match else name


def _scala_set(names: Iterable[str]) -> str:
    return f"Set({', '.join(sorted(names))})"


def _override(properties: dict[str, str], overrides: Mapping[str, str]) -> None:
    """Kafka's overrideProps: each override replaces the config and every synonym of it below
    (without touching base configs of listener overrides: other listeners use them)."""
    for name, value in overrides.items():
        for synonym in config_synonyms(name, match_listener_override=False):
            properties.pop(synonym, None)
        properties[name] = value


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: int


class DynamicBrokerConfig:
    """One broker's dynamic configs, and its `KafkaConfig` kept equal to their effect.

    `per_broker` mirrors `/config/brokers/<id>`, `cluster_default` `/config/brokers/<default>`;
    `static` the properties the broker started with. `load` replaces one level and updates the
    `KafkaConfig` values; `validate` checks a proposed level without changing anything.
    """

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.static: dict[str, str] = {k: str(v) for k, v in config.originals.items()}
        self.defaults: dict[str, str] = {
            name: _default_text(d.default)
            for name, d in DEFINITIONS.items()
            if d.default is not None
        }
        self.per_broker: dict[str, str] = {}
        self.cluster_default: dict[str, str] = {}

    # -- precedence ------------------------------------------------------------------------------

    def effective_properties(
        self,
        per_broker: Mapping[str, str] | None = None,
        cluster_default: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The static properties with the cluster default, then the per-broker configs, over
        them (the current ones where None is given)."""
        properties = dict(self.static)
        _override(properties, self.cluster_default if cluster_default is None else cluster_default)
        _override(properties, self.per_broker if per_broker is None else per_broker)
        return properties

    def synonyms(self, name: str) -> list[Synonym]:
        """Kafka's list for DescribeConfigs: each synonym's value at each level, dynamic
        per-broker first, then the dynamic default, the static properties, Kafka's defaults;
        leading entries for other names are dropped (e.g. listener overrides of a base config)."""
        names = config_synonyms(name)
        sensitive = is_sensitive(name)
        found: list[Synonym] = []
        for level, source in (
            (self.per_broker, DYNAMIC_BROKER_CONFIG),
            (self.cluster_default, DYNAMIC_DEFAULT_BROKER_CONFIG),
            (self.static, STATIC_BROKER_CONFIG),
            (self.defaults, DEFAULT_CONFIG),
        ):
            for synonym in names:
                if synonym in level:
                    found.append(Synonym(synonym, None if sensitive else level[synonym], source))
        while found and found[0].name != name:
            found.pop(0)
        return found

    # -- validation ------------------------------------------------------------------------------

    def validate(self, proposed: Mapping[str, str], per_broker: bool) -> None:
        """Check a proposed level (the whole new content of `/config/brokers/<id>` when
        `per_broker`, else of `/config/brokers/<default>`). InvalidRequestError with Kafka's
        wording when a config is not dynamic or a value is invalid."""
        check_names(proposed)
        if not per_broker and listener_ssl_names(proposed):
            raise InvalidRequestError(
                "Cannot update these configs at default cluster level, broker id must be "
                f"specified: {_scala_set(listener_ssl_names(proposed))}"
            )
        for name, value in proposed.items():
            try:
                _check_value(name, value)
            except ConfigError as e:
                raise InvalidRequestError(str(e)) from None
        if per_broker:
            properties = self.effective_properties(per_broker=proposed)
        else:
            properties = self.effective_properties(cluster_default=proposed)
        try:
            self._check_reconfiguration(properties)
        except (ConfigError, KafkaError, InvariantError, SecurityConfigError) as e:
            raise InvalidRequestError(f"Invalid dynamic configuration: {e}") from None

    def _check_reconfiguration(self, properties: Mapping[str, str]) -> None:
        """What the components would say of the new values (Kafka's validateReconfiguration)."""
        values = derive_values(properties)
        for name in _THREAD_COUNTS:
            new, current = int(values[name]), int(self.config[name])
            if new == current:
                continue
            if new < 1:
                raise ConfigError(f"{name} should be at least 1")
            if new < current // 2:
                raise ConfigError(
                    f"{name} cannot be reduced to less than half the current value {current}"
                )
            if new > current * 2:
                raise ConfigError(
                    f"{name} cannot be increased to more than double the current value {current}"
                )
        parse_overrides(values["max.connections.per.ip.overrides"])
        for name, value in properties.items():
            match = _LISTENER_CONFIG.fullmatch(name)
            if match and match.group(2) == "max.connections":
                convert_value("max.connections", value)
        shadow = self.shadow(properties)
        CleanerConfig.from_broker_config(shadow.__getitem__)
        log_config_for(shadow, {})
        for endpoint in self.config.listeners:
            if endpoint.uses_tls:
                server_context(
                    listener_ssl_config(properties, endpoint.listener, endpoint.security_protocol)
                )

    def shadow(self, properties: Mapping[str, str]) -> KafkaConfig:
        """A copy of the broker's config with the values `properties` give (for validation)."""
        shadow = copy.copy(self.config)
        shadow._values = derive_values(properties)
        return shadow

    # -- applying --------------------------------------------------------------------------------

    def load(
        self,
        *,
        per_broker: Mapping[str, str] | None = None,
        cluster_default: Mapping[str, str] | None = None,
    ) -> dict[str, tuple[Any, Any]]:
        """Replace one or both levels with what ZooKeeper holds, as Kafka's fromPersistentProps
        does: entries that are not dynamic, or whose value is invalid, are logged and ignored
        (another tool may have written them). Returns the values that changed."""
        if per_broker is not None:
            self.per_broker = usable_configs(per_broker, "broker")
        if cluster_default is not None:
            self.cluster_default = usable_configs(cluster_default, DEFAULT_ENTITY)
        try:
            return self.config.update_values(self.effective_properties())
        except ConfigError as e:
            # Each entry is valid alone but together they are not (e.g. message.max.bytes above
            # socket.request.max.bytes): keep the values we have, as Kafka keeps its config.
            log.error("dynamic broker configs could not be applied: %s", e)
            return {}

    def listener_limits(self, listeners: Iterable[str]) -> dict[str, int]:
        """Each listener's `listener.name.<l>.max.connections` in effect (unlimited without)."""
        properties = self.effective_properties()
        limits = {}
        for listener in listeners:
            raw = properties.get(f"listener.name.{listener.lower()}.max.connections")
            try:
                limits[listener] = int(raw) if raw is not None else _UNLIMITED
            except ValueError:
                limits[listener] = _UNLIMITED
        return limits


def topic_synonyms(
    dynamic: DynamicBrokerConfig, name: str, overrides: Mapping[str, str]
) -> list[Synonym]:
    """A topic config's synonyms for DescribeConfigs, as Kafka lists them: the topic's override,
    then its broker default at each level (see `DynamicBrokerConfig.synonyms`)."""
    broker_name = TOPIC_CONFIG_SYNONYMS.get(name)
    found = dynamic.synonyms(broker_name) if broker_name else []
    if name in overrides:
        found.insert(0, Synonym(name, overrides[name], DYNAMIC_TOPIC_CONFIG))
    return found


def check_names(proposed: Iterable[str]) -> None:
    """InvalidRequestError naming the configs that cannot be changed at run time."""
    names = set(proposed)
    unknown = {n for n in names if not is_declared(_base_name(n))}
    ssl_without_prefix = names & (SSL_FILE_CONFIGS | SSL_PASSWORD_CONFIGS)
    passwords = {n for n in names - ssl_without_prefix if _base_name(n) in SSL_PASSWORD_CONFIGS}
    static = names - unknown - ssl_without_prefix - passwords - {n for n in names if is_dynamic(n)}
    if static:
        raise InvalidRequestError(f"Cannot update these configs dynamically: {_scala_set(static)}")
    if ssl_without_prefix:
        raise InvalidRequestError(
            "These security configs can be dynamically updated only per-listener using the "
            f"listener prefix: {_scala_set(ssl_without_prefix)}"
        )
    if passwords:
        raise InvalidRequestError(
            "Password encoder secret not configured (Odradek stores no passwords in "
            f"ZooKeeper; keep them static): {_scala_set(passwords)}"
        )
    if unknown:
        raise InvalidRequestError(
            f"Unknown or unsupported broker configs (Odradek does not implement them): "
            f"{_scala_set(unknown)}"
        )


def usable_configs(stored: Mapping[str, str], entity: str) -> dict[str, str]:
    """The entries of a stored level that can be applied (Kafka's fromPersistentProps): the
    others are logged and ignored."""
    usable = {}
    for name, value in stored.items():
        try:
            check_names([name])
            _check_value(name, value)
        except (KafkaError, ConfigError) as e:
            log.error("dynamic config %s=%s of %s is ignored: %s", name, value, entity, e)
            continue
        usable[name] = value
    return usable


def _check_value(name: str, value: str) -> None:
    """ConfigError if `value` is not one of the declared config's (listener TLS files are
    checked by building the listener's TLS context)."""
    base = _base_name(name)
    if base in DEFINITIONS:
        convert_value(base, value)
    elif base in THROTTLE_CONFIGS:
        try:
            valid = int(value.strip()) >= 0
        except ValueError:
            valid = False
        if not valid:
            raise ConfigError(f"invalid value {value!r} for {base}: not a non-negative long")


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return java_double_text(value)
    return str(value)


def java_double_text(value: float) -> str:
    """A double as Java's Double.toString writes it (Kafka's DescribeConfigs values): plain
    decimals in [10^-3, 10^7), else `1.7976931348623157E308`."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(value)
    for precision in range(17):
        text = f"{value:.{precision}e}"
        if float(text) == value:
            break
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}E{int(exponent)}"


def value_text(name: str, value: Any) -> str | None:
    """A config's current value as DescribeConfigs writes it."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return ",".join(value)
    return _default_text(value)
