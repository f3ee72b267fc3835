"""Client quotas without a broker: Kafka's windowed rate and throttle time (the numbers of Kafka's
own ClientQuotaManagerTest), the eight levels of KIP-55 precedence and which clients share a
rate, the fetch cap, the request-time bound, and the replication throttle's replica lists."""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from odradek.cluster.replication_quota import (
    ALL_PARTITIONS,
    InvalidThrottledReplicasError,
    ReplicationQuotaManager,
    throttled_replicas,
)
from odradek.errors import KafkaError
from odradek.network.request_context import RequestContext
from odradek.protocol.build import build_response
from odradek.server.quota import admin, throttling
from odradek.server.quota.entities import DEFAULT, QuotaEntity, resolve
from odradek.server.quota.manager import ClientQuotaManager, ClientQuotas, QuotaType
from odradek.server.quota.rate import Rate, RateConfig, SimpleRate, throttle_time_ms


class Clock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def sleep(self, ms: int) -> None:
        self.now_ms += ms


def _manager(clock: Clock, quota_type: QuotaType = QuotaType.PRODUCE) -> ClientQuotaManager:
    return ClientQuotaManager(quota_type, RateConfig(11, 1000), clock)


def test_quota_violation_matches_kafka() -> None:
    """Kafka's ClientQuotaManagerTest.testQuotaViolation, step by step."""
    clock = Clock()
    manager = _manager(clock)
    manager.update_quota(QuotaEntity(client_id=DEFAULT), 500.0)
    for _ in range(10):  # 400 B/s under a 500 B/s quota: never throttled
        assert manager.record_and_get_throttle_ms("User:ANONYMOUS", "unknown", 400) == 0
        clock.sleep(1000)
    # A spike: (4000 + 2300) / 10.5 s = 600 B/s; (600 - 500) / 500 * 10.5 s = 2100 ms.
    clock.sleep(500)
    throttle = manager.record_and_get_throttle_ms("User:ANONYMOUS", "unknown", 2300)
    assert throttle == 2100
    clock.sleep(throttle)
    for _ in range(10):  # delays continue until the burst has aged out of the window
        manager.record_and_get_throttle_ms("User:ANONYMOUS", "unknown", 400)
        clock.sleep(1000)
    assert manager.record_and_get_throttle_ms("User:ANONYMOUS", "unknown", 0) == 0


def test_no_quota_records_nothing() -> None:
    clock = Clock()
    manager = _manager(clock)
    assert not manager.enabled
    assert manager.record_and_get_throttle_ms("User:a", "c", 10**12) == 0
    manager.update_quota(QuotaEntity(client_id="other"), 1.0)
    assert manager.enabled
    assert manager.record_and_get_throttle_ms("User:a", "c", 10**12) == 0  # not this client
    assert manager.record_and_get_throttle_ms("User:a", "other", 10**12) > 0


def test_the_first_burst_is_ten_windows_of_quota() -> None:
    """The padded window: a new client may send (samples - 1) windows' worth at once."""
    clock = Clock()
    manager = _manager(clock)
    manager.update_quota(QuotaEntity(client_id="c"), 1000.0)
    assert manager.record_and_get_throttle_ms("User:u", "c", 10_000) == 0
    assert manager.record_and_get_throttle_ms("User:u", "c", 1000) == 1000  # 11000/10 s


@given(
    st.integers(100, 100_000),
    st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(1.0, 3.0)), min_size=1, max_size=80),
)
def test_a_client_within_its_quota_is_never_throttled(
    bound: int, sends: list[tuple[float, float]]
) -> None:
    """Requests of at most one second's quota, each followed by at least the time it takes to
    send it at 90% of the quota: never throttled, whatever the sizes and gaps."""
    clock = Clock()
    manager = _manager(clock)
    manager.update_quota(QuotaEntity(client_id="c"), float(bound))
    for fraction, slack in sends:
        size = max(1, int(bound * fraction))
        assert manager.record_and_get_throttle_ms("User:u", "c", size) == 0
        clock.sleep(math.ceil(size / (0.9 * bound) * 1000 * slack))


@given(
    st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 3000)), min_size=1, max_size=60),
    st.integers(100, 20_000),
)
def test_the_throttle_brings_the_rate_back_to_the_bound(
    sends: list[tuple[int, int]], bound: int
) -> None:
    """After every request, of any size and at any time: no throttle when the measured rate is
    within the bound, else the delay X with rate x W / (W + X) = bound (to the millisecond)."""
    clock = Clock()
    manager = _manager(clock)
    manager.update_quota(QuotaEntity(client_id="c"), float(bound))
    for size, pause in sends:
        throttle = manager.record_and_get_throttle_ms("User:u", "c", size)
        rate = manager._rates[("", "c")]
        observed, window_ms = rate.measure_with_window(clock.now_ms)
        if observed <= bound:
            assert throttle == 0
        else:
            assert throttle > 0
            assert abs(observed * window_ms / (window_ms + throttle) - bound) <= (
                bound * 1.0 / window_ms + 1e-9 * bound
            ) * max(1.0, observed / bound)
        clock.sleep(throttle + pause)


def test_throttle_time_formula() -> None:
    assert throttle_time_ms(600, 500, 10_500) == 2100
    assert throttle_time_ms(500, 500, 10_000) == 0
    assert throttle_time_ms(100, 500, 10_000) == 0
    assert throttle_time_ms(1000.5, 1000, 1000) == 1  # half up, as Java's Math.round
    assert throttle_time_ms(10, 0, 1000) == 1000


def test_rate_samples_expire() -> None:
    rate = Rate(RateConfig(11, 1000))
    rate.record(11_000, 0)
    assert rate.measure(0) == pytest.approx(1100)  # over the padded 10 s
    assert rate.measure(10_999) == pytest.approx(11_000 / 10.999)
    assert rate.measure(11_000) == 0  # the sample's last event is 11 windows old


def test_simple_rate_pads_one_window_only() -> None:
    rate = SimpleRate(RateConfig(11, 1000))
    rate.record(1000, 0)
    assert rate.measure(0) == pytest.approx(1000)
    assert rate.measure(2000) == pytest.approx(500)


# -- precedence -------------------------------------------------------------------------------

LEVELS = [
    QuotaEntity("u", "c"),
    QuotaEntity("u", DEFAULT),
    QuotaEntity("u", None),
    QuotaEntity(DEFAULT, "c"),
    QuotaEntity(DEFAULT, DEFAULT),
    QuotaEntity(DEFAULT, None),
    QuotaEntity(None, "c"),
    QuotaEntity(None, DEFAULT),
]
SHARED_BY = [
    ("u", "c"),
    ("u", "c"),
    ("u", ""),
    ("u", "c"),
    ("u", "c"),
    ("u", ""),
    ("", "c"),
    ("", "c"),
]


def test_the_eight_levels_in_order() -> None:
    overrides = {entity: float(level) for level, entity in enumerate(LEVELS, start=1)}
    for level in range(1, 9):
        key, bound = resolve(overrides, "u", "c")
        assert bound == level
        assert key == SHARED_BY[level - 1]
        del overrides[LEVELS[level - 1]]
    assert resolve(overrides, "u", "c") == (("", "c"), None)


def _rank(entity: QuotaEntity) -> int | None:
    """An independent statement of KIP-55's order: specificity of the user part first (exact
    user, default user, none), then of the client part (exact, default), except that a
    user-only entity ranks after that user's user+client entities."""
    order = {
        ("exact", "exact"): 1, ("exact", "default"): 2, ("exact", "none"): 3,
        ("default", "exact"): 4, ("default", "default"): 5, ("default", "none"): 6,
        ("none", "exact"): 7, ("none", "default"): 8,
    }  # fmt: skip

    def kind(name: str | None, actual: str) -> str | None:
        if name is None:
            return "none"
        if name == DEFAULT:
            return "default"
        return "exact" if name == actual else None

    user, client = kind(entity.user, "u"), kind(entity.client_id, "c")
    if user is None or client is None:
        return None
    return order.get((user, client))


names = st.sampled_from(["u", "c", "x", DEFAULT, None])


@given(st.dictionaries(st.builds(QuotaEntity, names, names), st.floats(1, 1e9), max_size=12))
def test_precedence_picks_the_most_specific_matching_entity(
    overrides: dict[QuotaEntity, float],
) -> None:
    overrides.pop(QuotaEntity(None, None), None)
    ranked = sorted((rank, entity) for entity in overrides if (rank := _rank(entity)) is not None)  # type: ignore[type-var]
    _key, bound = resolve(overrides, "u", "c")
    if not ranked:
        assert bound is None
    else:
        assert bound == overrides[ranked[0][1]]


def test_a_user_quota_is_shared_by_its_clients_and_a_default_is_not() -> None:
    clock = Clock()
    manager = _manager(clock)
    manager.update_quota(QuotaEntity(user="alice"), 1000.0)
    manager.update_quota(QuotaEntity(user=DEFAULT), 1000.0)
    assert manager.record_and_get_throttle_ms("User:alice", "c1", 10_000) == 0
    assert manager.record_and_get_throttle_ms("User:alice", "c2", 1000) > 0  # shared with c1
    assert manager.record_and_get_throttle_ms("User:bob", "c1", 10_000) == 0  # own default
    assert manager.record_and_get_throttle_ms("User:carol", "c1", 10_000) == 0


def test_names_are_sanitized_as_in_zookeeper() -> None:
    manager = _manager(Clock())
    manager.update_quota(QuotaEntity(user="CN%3Dalice%2COU%3Dx"), 5.0)
    assert manager.quota("User:CN=alice,OU=x", "c") == 5.0


def test_fetch_cap_and_request_bound() -> None:
    clock = Clock()
    quotas = ClientQuotas(RateConfig(11, 1000), clock)
    quotas.update_entity(
        QuotaEntity(client_id="c"),
        {"consumer_byte_rate": "2048", "request_percentage": "1", "SCRAM-SHA-256": "x"},
    )
    assert quotas.fetch.max_value_in_window("User:u", "c") == 2048 * 10
    assert quotas.produce.max_value_in_window("User:u", "c") is None
    # 50 ms of handler time a request: far over 1% of a thread, but held a window at most.
    throttle = quotas.request.record_and_get_throttle_ms("User:u", "c", 5.0 * 100)
    assert throttle == 1000
    quotas.update_entity(QuotaEntity(client_id="c"), {})  # every quota of the entity removed
    assert quotas.fetch.quota("User:u", "c") is None


def test_unrecord_takes_back_a_throttled_fetch() -> None:
    clock = Clock()
    manager = _manager(clock, QuotaType.FETCH)
    manager.update_quota(QuotaEntity(client_id="c"), 100.0)
    assert manager.record_and_get_throttle_ms("User:u", "c", 1000) == 0
    throttle = manager.record_and_get_throttle_ms("User:u", "c", 1000)
    assert throttle > 0
    manager.unrecord("User:u", "c", 1000)
    assert manager.rate("User:u", "c") == pytest.approx(100.0)


def test_entity_paths_round_trip() -> None:
    for entity in LEVELS:
        assert QuotaEntity.from_zk_entity_path(entity.zk_entity_path()) == entity
    assert QuotaEntity.from_zk_entity_path("topics/t") is None
    assert QuotaEntity.from_zk_entity_path("users/u/clients") is None
    assert QuotaEntity.from_zk_entity_path("users/u/groups/c") is None


# -- replication throttles ------------------------------------------------------------------


def test_throttled_replica_lists() -> None:
    assert throttled_replicas("0:1,1:2,2:1", broker_id=1) == {0, 2}
    assert throttled_replicas(" 0:1 , 3:1 ", broker_id=1) == {0, 3}
    assert throttled_replicas("*", broker_id=7) is ALL_PARTITIONS
    assert throttled_replicas("", broker_id=1) == frozenset()
    for bad in ("0-1", "a:1", "*,0:1", "0:1:2"):
        with pytest.raises(InvalidThrottledReplicasError):
            throttled_replicas(bad, broker_id=1)


def test_replication_quota_manager() -> None:
    clock = Clock()
    configs = {"t": {"leader.replication.throttled.replicas": "0:1,1:2"}}
    manager = ReplicationQuotaManager(
        "leader.replication.throttled.replicas",
        lambda: SimpleRate(RateConfig(11, 1000)),
        broker_id=1,
        topic_config=lambda topic: configs.get(topic, {}),
        clock_ms=clock,
    )
    assert manager.is_throttled("t", 0)
    assert not manager.is_throttled("t", 1)  # broker 2's replica
    assert not manager.is_throttled("other", 0)
    assert not manager.enabled and not manager.is_quota_exceeded()
    manager.update_quota(1000.0)
    manager.record(1000)
    assert not manager.is_quota_exceeded()
    manager.record(1)
    assert manager.is_quota_exceeded()
    clock.sleep(2000)
    assert not manager.is_quota_exceeded()  # 1001 bytes over 2 s
    configs["t"] = {"leader.replication.throttled.replicas": "*"}
    assert manager.is_throttled("t", 5)


# -- DescribeClientQuotas / AlterClientQuotas ------------------------------------------------

STORED = {
    QuotaEntity(user="alice"): {"producer_byte_rate": "100", "SCRAM-SHA-256": "salt=..."},
    QuotaEntity(user="bob"): {"SCRAM-SHA-256": "salt=..."},  # credentials only: not a quota
    QuotaEntity(user="alice", client_id="c1"): {"consumer_byte_rate": "200"},
    QuotaEntity(user=DEFAULT, client_id=DEFAULT): {"request_percentage": "12.5"},
    QuotaEntity(client_id="c1"): {"producer_byte_rate": "300"},
    QuotaEntity(client_id=DEFAULT): {"producer_byte_rate": "400"},
}


def _described(components: list[admin.Component], strict: bool) -> set[str]:
    return {e.zk_entity_path() for e, _values in admin.describe(STORED, components, strict)}


def test_describe_filters_as_kafka() -> None:
    any_user = admin.Component("user", admin.MATCH_ANY, None)
    any_client = admin.Component("client-id", admin.MATCH_ANY, None)
    alice = admin.Component("user", admin.MATCH_EXACT, "alice")
    default_user = admin.Component("user", admin.MATCH_DEFAULT, None)
    assert _described([], False) == {e.zk_entity_path() for e in STORED} - {"users/bob"}
    assert _described([], True) == set()
    assert _described([alice], True) == {"users/alice"}
    assert _described([alice], False) == {"users/alice", "users/alice/clients/c1"}
    assert _described([any_user, any_client], True) == {
        "users/alice/clients/c1",
        "users/<default>/clients/<default>",
    }
    assert _described([default_user, any_client], True) == {"users/<default>/clients/<default>"}
    assert _described([any_client], True) == {"clients/c1", "clients/<default>"}
    values = dict(admin.describe(STORED, [alice], True))
    assert values == {QuotaEntity(user="alice"): {"producer_byte_rate": 100.0}}


@pytest.mark.parametrize(
    ("components", "code", "message"),
    [
        ([("user", 2, None), ("user", 0, "a")], "invalid_request", "Duplicate user filter"),
        ([("", 2, None)], "invalid_request", "Unexpected empty filter component entity type"),
        ([("group", 2, None)], "unsupported_version", "Custom entity type 'group' not supported"),
        ([("ip", 2, None), ("user", 2, None)], "invalid_request", "IP filter component"),
        ([("user", 7, None)], "invalid_request", "Unexpected match type: 7"),
        ([("user", 0, None)], "invalid_request", "needs a name"),
    ],
)
def test_describe_refuses_bad_filters(
    components: list[tuple[str, int, str | None]], code: str, message: str
) -> None:
    with pytest.raises(KafkaError) as raised:
        admin.describe(STORED, [admin.Component(*c) for c in components], False)
    assert raised.value.code == getattr(ErrorCode, code)
    assert message in str(raised.value)


def test_alter_entities_and_ops() -> None:
    assert admin.parse_entity([("user", "CN=a,O=b"), ("client-id", None)]) == QuotaEntity(
        "CN%3Da%2CO%3Db", DEFAULT
    )
    for parts, message in [
        ([], "Invalid empty client quota entity"),
        ([("user", "")], "Empty user not supported"),
        ([("group", "g")], "Unhandled client quota entity type: group"),
        ([("ip", "1.2.3.4"), ("user", "u")], "IP entity should not be used"),
    ]:
        with pytest.raises(KafkaError, match=message):
            admin.parse_entity(parts)
    config = {"SCRAM-SHA-512": "keep me", "request_percentage": "1.0"}
    assert admin.apply_ops(
        config,
        [
            ("producer_byte_rate", 1048576.0000001, False),
            ("request_percentage", 0, True),
            ("consumer_byte_rate", 2e7, False),
            ("controller_mutation_rate", 1e7, False),
            ("not_set", 0, True),
        ],
    ) == {
        "SCRAM-SHA-512": "keep me",
        "producer_byte_rate": "1048576",
        "consumer_byte_rate": "20000000",
        "controller_mutation_rate": "1.0E7",
    }
    for op, message in [
        (("producer_byte_rate", 10.5, False), "must be a LONG value"),
        (("SCRAM-SHA-256", 1, False), "Invalid configuration key SCRAM-SHA-256"),
        (("consumer_byte_rate", float("inf"), False), "must be a LONG value"),
    ]:
        with pytest.raises(KafkaError, match=message):
            admin.apply_ops({}, [op])


def test_java_double_strings() -> None:
    cases = {50.0: "50.0", 12.5: "12.5", 1e7: "1.0E7", 1e-4: "1.0E-4", 0.001: "0.001"}
    cases |= {123456789.0: "1.23456789E8", -2e8: "-2.0E8", 9999999.0: "9999999.0"}
    for value, text in cases.items():
        assert admin.java_double_string(value) == text


# -- throttling helpers (what the handlers call) ---------------------------------------------


def _context(client_id: str, muted: list[int], size: int = 0) -> RequestContext:
    header = SimpleNamespace(api_key=3, api_version=12, correlation_id=1, client_id=client_id)
    return RequestContext(
        header,  # type: ignore[arg-type]
        "127.0.0.1:1",
        "127.0.0.1",
        "User:alice",
        size=size,
        throttle=muted.append,
    )


def test_request_quota_sets_the_response_throttle_and_mutes() -> None:
    clock = Clock()
    quotas = ClientQuotas(RateConfig(11, 1000), clock)
    assert not throttling.request_quota_applies(quotas, 3)  # no quota: the quick check says no
    quotas.update_entity(QuotaEntity(user="alice"), {"request_percentage": "0.001"})
    assert throttling.request_quota_applies(quotas, 3)
    assert not throttling.request_quota_applies(quotas, 4)  # LeaderAndIsr is exempt
    muted: list[int] = []

    def handler() -> Any:
        time.sleep(0.002)  # 2 ms of handler time: 0.2% of a thread-second, over 0.001%
        return build_response(
            SimpleNamespace(api_key=18, api_version=3),  # type: ignore[arg-type]
            {"error_code": 0, "api_keys": [], "throttle_time": 0},
        )

    response = throttling.throttle_request(quotas, _context("c", muted), handler)
    assert muted == [1000]  # bounded by one window
    assert response.throttle_time == datetime.timedelta(milliseconds=1000)

    async def later() -> Any:
        return handler()

    async def run() -> Any:
        return await throttling.throttle_request(quotas, _context("c", muted), later)

    assert asyncio.run(run()).throttle_time == datetime.timedelta(milliseconds=1000)


def test_produce_and_fetch_throttles() -> None:
    clock = Clock()
    quotas = ClientQuotas(RateConfig(11, 1000), clock)
    muted: list[int] = []
    assert throttling.produce_throttle_ms(quotas, _context("p", muted, 10**9), 1, 0) == 0
    quotas.update_entity(QuotaEntity(client_id="p"), {"producer_byte_rate": "1000"})
    quotas.update_entity(QuotaEntity(client_id="f"), {"consumer_byte_rate": "1000"})
    assert throttling.produce_throttle_ms(quotas, _context("p", muted, 10_000), 1, 0) == 0
    assert throttling.produce_throttle_ms(quotas, _context("p", muted, 1_000), 0, 0) == 1000
    assert muted == [1000]
    assert throttling.fetch_max_bytes(quotas, _context("f", muted), 10**9) == 10_000
    assert throttling.fetch_max_bytes(quotas, _context("x", muted), 10**9) == 10**9
    assert throttling.fetch_throttle_ms(quotas, _context("f", muted), 10_000, 0) == 0
    assert throttling.fetch_throttle_ms(quotas, _context("f", muted), 5_000, 0) == 5000
    # The throttled fetch's bytes were taken back: the client is exactly at its quota.
    assert quotas.fetch.rate("User:alice", "f") == pytest.approx(1000)
