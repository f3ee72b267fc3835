"""The quota managers the request handlers ask (Kafka's `ClientQuotaManager`,
`ClientRequestQuotaManager` and `QuotaFactory.QuotaManagers`).

One `ClientQuotaManager` per quota type: `produce` (request bytes, `producer_byte_rate`), `fetch`
(response bytes, `consumer_byte_rate`) and `request` (handler time as a percentage of one
thread, `request_percentage`). Each keeps the configured entities of its type, and a `Rate` per
rate key (`odradek.server.quota.entities.resolve`). A handler records what a request used and gets
back how long the client must be throttled: 0, or the time that brings the rate back to its bound
(`odradek.server.quota.rate.throttle_time_ms`). The response carries that time in
`throttle_time_ms` and the connection stops reading the client's requests for that long
(KIP-219): a client that ignores the field is held back all the same.

Off the hot path: `enabled` is False until a quota of the type has been configured on this broker
(and stays True afterwards, as in Kafka, until a restart), and a handler asks nothing more when
it is False. With quotas, a request costs a dict lookup (the resolution of its user and client id
is memoised until the next configuration change) and one sample update: nothing per record.

Rates of clients idle for an hour are dropped (Kafka's sensor expiry).

Concurrency: the broker's event loop thread only.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from odradek.security.znodes import sanitize
from odradek.server.quota.entities import QuotaEntity, QuotaKey, resolve
from odradek.server.quota.rate import Rate, RateConfig, throttle_time_ms

INACTIVE_RATE_EXPIRATION_MS = 3600 * 1000
"""Kafka's `ClientQuotaManager.InactiveSensorExpirationTimeSeconds`."""
_EXPIRY_CHECK_INTERVAL_MS = 60 * 1000


class QuotaType(enum.Enum):
    PRODUCE = "producer_byte_rate"
    FETCH = "consumer_byte_rate"
    REQUEST = "request_percentage"
    CONTROLLER_MUTATION = "controller_mutation_rate"

    @property
    def config_key(self) -> str:
        return self.value


def principal_user(principal: str) -> str:
    """The user name of a principal as quotas see it (`User:alice` -> `alice`)."""
    _type, sep, name = principal.partition(":")
    return name if sep else principal


class ClientQuotaManager:
    """The quotas and rates of one quota type. Event-loop thread only."""

    def __init__(
        self,
        quota_type: QuotaType,
        config: RateConfig | None = None,
        clock_ms: Callable[[], int] | None = None,
        max_throttle_ms: int | None = None,
    ) -> None:
        self.quota_type = quota_type
        self.config = config or RateConfig()
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._max_throttle_ms = max_throttle_ms
        self.enabled = False
        self.overrides: dict[QuotaEntity, float] = {}
        self._resolved: dict[tuple[str, str], tuple[QuotaKey, float | None]] = {}
        self._rates: dict[QuotaKey, Rate] = {}
        self._next_expiry_check_ms = 0

    # configuration

    def update_quota(self, entity: QuotaEntity, bound: float | None) -> None:
        """Set (or, with None, remove) the quota of `entity`."""
        if bound is None:
            self.overrides.pop(entity, None)
        else:
            self.overrides[entity] = bound
            self.enabled = True
        self._resolved.clear()

    def quota(self, principal: str, client_id: str) -> float | None:
        """The bound that applies to a connection (None: unlimited)."""
        return self._resolve(principal, client_id)[1]

    def _resolve(self, principal: str, client_id: str) -> tuple[QuotaKey, float | None]:
        found = self._resolved.get((principal, client_id))
        if found is None:
            found = resolve(
                self.overrides, sanitize(principal_user(principal)), sanitize(client_id)
            )
            if len(self._resolved) > 100_000:  # a flood of client ids: keep memory bounded
                self._resolved.clear()
            self._resolved[(principal, client_id)] = found
        return found

    # recording

    def record_and_get_throttle_ms(
        self, principal: str, client_id: str, value: float, now_ms: int | None = None
    ) -> int:
        """Record `value` for the connection's rate; the throttle time if its bound is now
        exceeded, else 0 (Kafka's `maybeRecordAndGetThrottleTimeMs`)."""
        if not self.enabled:
            return 0
        key, bound = self._resolve(principal, client_id)
        if bound is None:
            return 0
        now = self._clock_ms() if now_ms is None else now_ms
        rate = self._rate(key, now)
        rate.record(value, now)
        observed, window_ms = rate.measure_with_window(now)
        throttle = throttle_time_ms(observed, bound, window_ms)
        if self._max_throttle_ms is not None:
            throttle = min(throttle, self._max_throttle_ms)
        return throttle

    def unrecord(
        self, principal: str, client_id: str, value: float, now_ms: int | None = None
    ) -> None:
        """Take back a recorded value (a throttled fetch answers without its records)."""
        if not self.enabled:
            return
        key, bound = self._resolve(principal, client_id)
        if bound is None:
            return
        now = self._clock_ms() if now_ms is None else now_ms
        self._rate(key, now).record(-value, now)

    def max_value_in_window(self, principal: str, client_id: str) -> float | None:
        """The most one request may use without being throttled for sure: bound x (samples - 1)
        windows (a consumer's fetch is capped to it); None without a bound."""
        if not self.enabled:
            return None
        bound = self._resolve(principal, client_id)[1]
        if bound is None:
            return None
        return bound * (self.config.samples - 1) * self.config.window_ms / 1000

    def _rate(self, key: QuotaKey, now_ms: int) -> Rate:
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = Rate(self.config)
        if now_ms >= self._next_expiry_check_ms:
            self._next_expiry_check_ms = now_ms + _EXPIRY_CHECK_INTERVAL_MS
            for stale in [
                k
                for k, r in self._rates.items()
                if k != key and now_ms - r.last_event_ms() > INACTIVE_RATE_EXPIRATION_MS
            ]:
                del self._rates[stale]
        return rate

    def rate(self, principal: str, client_id: str, now_ms: int | None = None) -> float:
        """The connection's current rate (bytes or percent per second); 0 without a quota."""
        key, _bound = self._resolve(principal, client_id)
        rate = self._rates.get(key)
        if rate is None:
            return 0.0
        return rate.measure(self._clock_ms() if now_ms is None else now_ms)


class ClientQuotas:
    """The broker's client quota managers (Kafka's `QuotaManagers`, client part)."""

    def __init__(
        self, config: RateConfig | None = None, clock_ms: Callable[[], int] | None = None
    ) -> None:
        config = config or RateConfig()
        self.produce = ClientQuotaManager(QuotaType.PRODUCE, config, clock_ms)
        self.fetch = ClientQuotaManager(QuotaType.FETCH, config, clock_ms)
        # A request-time throttle is at most one window (ClientRequestQuotaManager).
        self.request = ClientQuotaManager(
            QuotaType.REQUEST, config, clock_ms, max_throttle_ms=config.window_ms
        )
        self.by_type = {
            QuotaType.PRODUCE: self.produce,
            QuotaType.FETCH: self.fetch,
            QuotaType.REQUEST: self.request,
        }

    @property
    def enabled(self) -> bool:
        return self.produce.enabled or self.fetch.enabled or self.request.enabled

    def update_entity(self, entity: QuotaEntity, config: dict[str, str]) -> None:
        """Apply an entity's whole config (from its znode): each quota type's key sets or, when
        absent or unparsable, removes that quota. Other keys (SCRAM credentials) are ignored."""
        for quota_type, manager in self.by_type.items():
            text = config.get(quota_type.config_key)
            bound: float | None
            try:
                bound = float(text) if text is not None else None
            except ValueError:
                bound = None
            manager.update_quota(entity, bound)


NANOS_TO_PERCENT = 100.0 / 1e9
"""Handler time in nanoseconds to a percentage of one second (ClientRequestQuotaManager)."""


def request_time_percent(nanos: int) -> float:
    return nanos * NANOS_TO_PERCENT
