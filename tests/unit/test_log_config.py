"""LogConfig: Kafka's topic and broker property names, defaults and validation."""

from __future__ import annotations

import pytest

from odradek.errors import InvalidConfigurationError
from odradek.log.config import TOPIC_CONFIG_NAMES, LogConfig


def test_defaults_are_kafkas() -> None:
    config = LogConfig()
    assert config.segment_bytes == 1 << 30
    assert config.segment_ms == config.retention_ms == 604_800_000
    assert config.retention_bytes == -1
    assert config.index_interval_bytes == 4096
    assert config.segment_index_bytes == 10 << 20
    assert config.max_message_bytes == 1_048_588
    assert config.message_timestamp_type == "CreateTime" and not config.uses_log_append_time
    assert config.file_delete_delay_ms == 60_000


def test_from_properties_overrides_defaults() -> None:
    defaults = LogConfig(retention_ms=1_000)
    config = LogConfig.from_properties(
        {
            "segment.bytes": "2048",
            "retention.bytes": " 100 ",
            "message.timestamp.type": "LogAppendTime",
            "unclean.leader.election.enable": "TRUE",
            "min.insync.replicas": "2",
            "cleanup.policy": "compact, delete,compact",
        },
        defaults,
    )
    assert config.segment_bytes == 2048
    assert config.retention_bytes == 100
    assert config.retention_ms == 1_000
    assert config.uses_log_append_time
    assert config.unclean_leader_election_enable
    assert config.min_insync_replicas == 2
    assert config.cleanup_policy == ("compact", "delete")
    assert config.compact and config.delete
    assert LogConfig.from_properties(config.to_properties()) == config
    assert set(config.to_properties()) == TOPIC_CONFIG_NAMES


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("segment.bytes", "abc", "segment.bytes must be an integer"),
        ("segment.bytes", "10", "segment.bytes must be between 14"),
        ("retention.ms", "-2", "retention.ms must be between -1"),
        ("message.timestamp.type", "NowTime", "CreateTime or LogAppendTime"),
        ("unclean.leader.election.enable", "yes", "true or false"),
        ("max.message.bytes", "99999999999", "max.message.bytes must be between"),
    ],
)
def test_bad_values_are_clear_errors(name: str, value: str, message: str) -> None:
    with pytest.raises(InvalidConfigurationError, match=message):
        LogConfig.from_properties({name: value})


def test_direct_construction_is_validated() -> None:
    with pytest.raises(InvalidConfigurationError):
        LogConfig(segment_bytes=0)


def test_from_broker_properties() -> None:
    config = LogConfig.from_broker_properties(
        {
            "log.segment.bytes": "4096",
            "log.roll.hours": "2",
            "log.retention.hours": "5",
            "log.retention.minutes": "3",
            "message.max.bytes": "500",
            "log.message.timestamp.type": "LogAppendTime",
        }
    )
    assert config.segment_bytes == 4096
    assert config.segment_ms == 2 * 3_600_000
    assert config.retention_ms == 3 * 60_000  # minutes win over hours
    assert config.max_message_bytes == 500
    assert config.uses_log_append_time
    assert LogConfig.from_broker_properties({"log.retention.ms": "-1"}).retention_ms == -1
