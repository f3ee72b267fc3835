"""Kafka's on-disk log: segments, indexes, recovery, checkpoints and the log manager."""

from odradek.log.config import LogConfig
from odradek.log.log import Log, LogAppendInfo
from odradek.log.log_manager import LogManager

__all__ = ["Log", "LogAppendInfo", "LogConfig", "LogManager"]
