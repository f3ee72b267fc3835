"""Offset arithmetic and option checking of the Spark data source: pure, no Spark, no cluster."""

from __future__ import annotations

import itertools
import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from odradek.errors import DataSourceOptionError
from odradek.spark.offsets import (
    OffsetRange,
    TopicPartition,
    offsets_from_json,
    offsets_to_json,
    parse_assign,
    parse_offset_spec,
    plan_ranges,
    rate_limit,
)
from odradek.spark.options import SinkOptions, SourceOptions, kafka_params
from odradek.spark.reader import resolve_offsets

TP = TopicPartition
BOOT = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


# -- JSON shape ------------------------------------------------------------------------------


def test_offsets_json_is_sparks_shape_in_numeric_partition_order() -> None:
    offsets = {TP("b", 10): 5, TP("b", 2): 7, TP("a", 0): 1}
    obj = offsets_to_json(offsets)
    assert json.dumps(obj) == '{"a": {"0": 1}, "b": {"2": 7, "10": 5}}'
    assert offsets_from_json(json.loads(json.dumps(obj)), "x") == offsets


@given(
    st.dictionaries(
        st.tuples(st.sampled_from(["t", "u", "orders"]), st.integers(0, 50)),
        st.integers(0, 2**40),
    )
)
def test_offsets_json_roundtrip_is_deterministic(raw: dict[tuple[str, int], int]) -> None:
    offsets = {TP(t, p): o for (t, p), o in raw.items()}
    shuffled = dict(reversed(list(offsets.items())))
    text = json.dumps(offsets_to_json(offsets))
    assert json.dumps(offsets_to_json(shuffled)) == text
    assert offsets_from_json(json.loads(text), "x") == offsets


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('{"t": {"0": "x"}}', "must be an integer"),
        ('{"t": {"p": 1}}', "is not a number"),
        ('{"t": [0, 1]}', "must map partition numbers"),
        ('{"t": {"0": -3}}', "-2 for earliest"),
        ("{not json", "not valid JSON"),
        ("soonest", "expected"),
    ],
)
def test_offset_spec_errors_name_the_option(text: str, fragment: str) -> None:
    with pytest.raises(DataSourceOptionError, match="startingOffsets") as info:
        parse_offset_spec(text, "startingOffsets")
    assert fragment in str(info.value)


def test_offset_spec_kinds() -> None:
    assert parse_offset_spec(" Earliest ", "o").kind == "earliest"
    assert parse_offset_spec("latest", "o").kind == "latest"
    spec = parse_offset_spec('{"t":{"0":23,"1":-2}}', "o")
    assert spec.kind == "specific" and spec.offsets == {TP("t", 0): 23, TP("t", 1): -2}


def test_parse_assign() -> None:
    assert parse_assign('{"b":[1,0],"a":[2]}') == [TP("a", 2), TP("b", 0), TP("b", 1)]
    for bad in ("{}", '{"a": 1}', '{"a": ["x"]}', "[1]"):
        with pytest.raises(DataSourceOptionError, match="assign"):
            parse_assign(bad)


def test_resolve_offsets_turns_markers_into_offsets() -> None:
    parts = [TP("t", 0), TP("t", 1), TP("t", 2)]
    low = {tp: 10 for tp in parts}
    high = {tp: 100 for tp in parts}
    spec = parse_offset_spec('{"t":{"0":-2,"1":-1}}', "startingOffsets")
    assert resolve_offsets(spec, parts, low, high, "startingOffsets", -2) == {
        TP("t", 0): 10,
        TP("t", 1): 100,
        TP("t", 2): 10,  # left out: the default
    }
    with pytest.raises(Exception, match=r"startingOffsets: t-7 do not exist"):
        resolve_offsets(
            parse_offset_spec('{"t":{"7":1}}', "s"), parts, low, high, "startingOffsets", -2
        )


# -- planning ---------------------------------------------------------------------------------


def test_offset_range_is_picklable_and_splits_evenly() -> None:
    r = OffsetRange("t", 3, 10, 20)
    assert pickle.loads(pickle.dumps(r)) == r
    pieces = r.split(3)
    assert [(p.from_offset, p.until_offset) for p in pieces] == [(10, 13), (13, 16), (16, 20)]
    assert len(OffsetRange("t", 0, 0, 2).split(5)) == 2  # never an empty piece


def test_plan_ranges_one_task_per_partition_and_drops_empty() -> None:
    ranges = [OffsetRange("t", 1, 5, 5), OffsetRange("t", 0, 0, 10)]
    assert plan_ranges(ranges) == [OffsetRange("t", 0, 0, 10)]


def test_plan_ranges_min_partitions_splits_the_biggest() -> None:
    ranges = [OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 0, 100)]
    planned = plan_ranges(ranges, min_partitions=10)
    assert len(planned) == 10
    assert sum(1 for r in planned if r.partition == 0) == 9
    # The pieces cover every offset exactly once, in order.
    for partition, (lo, hi) in {0: (0, 900), 1: (0, 100)}.items():
        pieces = [r for r in planned if r.partition == partition]
        assert pieces[0].from_offset == lo and pieces[-1].until_offset == hi
        assert all(a.until_offset == b.from_offset for a, b in itertools.pairwise(pieces))


@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=6),
    st.integers(1, 40),
    st.one_of(st.none(), st.integers(1, 30)),
)
def test_plan_ranges_covers_everything_with_enough_tasks(
    sizes: list[int], min_partitions: int, max_records: int | None
) -> None:
    ranges = [OffsetRange("t", p, 7, 7 + n) for p, n in enumerate(sizes)]
    planned = plan_ranges(ranges, min_partitions, max_records)
    total = sum(sizes)
    assert sum(r.size for r in planned) == total
    assert all(r.size > 0 for r in planned)
    assert len(planned) >= min(min_partitions, total)
    if max_records:
        assert all(r.size <= max_records for r in planned)


def test_rate_limit_shares_by_backlog() -> None:
    start = {TP("t", 0): 0, TP("t", 1): 100}
    latest = {TP("t", 0): 300, TP("t", 1): 200, TP("t", 2): 100}  # t-2 is new: starts at 0
    end = rate_limit(start, latest, 100)
    assert end == {TP("t", 0): 60, TP("t", 1): 120, TP("t", 2): 20}
    assert rate_limit(start, latest, 10_000) == latest


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=8),
    st.integers(1, 3000),
)
def test_rate_limit_reads_exactly_the_limit(pairs: list[tuple[int, int]], limit: int) -> None:
    start = {TP("t", i): a for i, (a, _) in enumerate(pairs)}
    latest = {TP("t", i): a + b for i, (a, b) in enumerate(pairs)}
    end = rate_limit(start, latest, limit)
    backlog = sum(b for _, b in pairs)
    assert sum(end[tp] - start[tp] for tp in start) == min(limit, backlog)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)


# -- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({}, "one of the options 'subscribe', 'subscribePattern' or 'assign' is required"),
        ({"subscribe": "a", "assign": '{"a":[0]}'}, "only one of"),
        ({"subscribe": "a", "subscribePattern": "a.*"}, "only one of"),
        ({"subscribePattern": "a["}, "subscribePattern: invalid regular expression"),
        ({"assign": "{bad"}, "assign: not valid JSON"),
        ({"subscribe": "a", "startingOffsets": "{bad"}, "startingOffsets: not valid JSON"),
        (
            {"subscribe": "a", "startingOffsets": '{"b":{"0":1}}'},
            "startingOffsets: offsets given for b-0",
        ),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss: expected true or false"),
        ({"subscribe": "a", "minPartitions": "0"}, "minPartitions: expected a positive integer"),
        ({"subscribe": "a", "kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit is not"),
        ({"subscribe": "a", "kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
    ],
)
def test_source_option_errors(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(DataSourceOptionError) as info:
        SourceOptions.parse({**BOOT, **options})
    assert fragment in str(info.value)


def test_bootstrap_is_required() -> None:
    with pytest.raises(DataSourceOptionError, match=r"kafka\.bootstrap\.servers"):
        SourceOptions.parse({"subscribe": "a"})
    with pytest.raises(DataSourceOptionError, match=r"kafka\.bootstrap\.servers"):
        SinkOptions.parse({"topic": "a"})


def test_batch_and_stream_rules() -> None:
    options = SourceOptions.parse({**BOOT, "subscribe": "a"})
    assert options.for_batch().starting_offsets.kind == "earliest"  # type: ignore[union-attr]
    assert options.for_batch().ending_offsets.kind == "latest"  # type: ignore[union-attr]
    assert options.for_stream().starting_offsets.kind == "latest"  # type: ignore[union-attr]
    with pytest.raises(DataSourceOptionError, match="endingOffsets is not allowed in a streaming"):
        SourceOptions.parse({**BOOT, "subscribe": "a", "endingOffsets": "latest"}).for_stream()
    with pytest.raises(DataSourceOptionError, match="startingOffsets: 'latest'"):
        SourceOptions.parse({**BOOT, "subscribe": "a", "startingOffsets": "latest"}).for_batch()
    with pytest.raises(DataSourceOptionError, match="endingOffsets: 'earliest'"):
        SourceOptions.parse(
            {**BOOT, "subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'}
        ).for_batch()


def test_options_are_case_insensitive_and_pass_kafka_params() -> None:
    options = SourceOptions.parse(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "h:1",
            "SubscribePattern": "ord.*",
            "includeheaders": "TRUE",
            "kafka.client.id": "me",
        }
    )
    assert options.bootstrap_servers == "h:1"
    assert options.include_headers is True
    assert options.subscription.matches("orders") and not options.subscription.matches("xorders")
    assert not options.subscription.matches("__consumer_offsets")
    assert options.client_params == {"client.id": "me"}
    assert pickle.loads(pickle.dumps(options)) == options


def test_sink_options() -> None:
    assert SinkOptions.parse({**BOOT, "topic": " out "}).topic == "out"
    with pytest.raises(DataSourceOptionError, match="subscribe is a read option"):
        SinkOptions.parse({**BOOT, "subscribe": "a"})
    with pytest.raises(DataSourceOptionError, match="acks=all"):
        kafka_params({"kafka.acks": "1"}, sink=True)


def test_consumer_config_owns_offsets_but_takes_a_group_id() -> None:
    from odradek.spark.clients import CONSUMER_GROUP_ID, consumer_config, producer_config

    assert consumer_config("h:1", {})["group.id"] == CONSUMER_GROUP_ID
    config = consumer_config("h:1", {"group.id": "mine", "client.id": "me"})
    assert (config["group.id"], config["client.id"]) == ("mine", "me")
    assert config["enable.auto.commit"] is False and config["auto.offset.reset"] == "error"
    producer = producer_config("h:1", {"linger.ms": "50"})
    assert (producer["acks"], producer["enable.idempotence"]) == ("all", False)
    assert producer["linger.ms"] == "50" and producer["partitioner"] == "murmur2_random"
