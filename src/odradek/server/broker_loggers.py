"""Broker loggers (KIP-412, the BROKER_LOGGER config resource): the broker's Python loggers and
their levels, listed by DescribeConfigs and changed at run time by IncrementalAlterConfigs, as
Kafka does with its log4j loggers (`kafka-configs.sh --entity-type broker-loggers`).

Levels have log4j's names: TRACE (Python level 5), DEBUG, INFO, WARN, ERROR, FATAL (CRITICAL).
A logger without a level of its own shows its effective level (its nearest ancestor's, else the
root's); the root logger is called `root`. SET gives a logger a level, DELETE removes it (the
logger inherits again; not allowed on `root`); APPEND and SUBTRACT are refused. As in Kafka,
changes are not persisted: a restarted broker logs at its configured levels again.

Kafka's errors and messages: an unknown logger or level is INVALID_CONFIG (`Logger x does not
exist!`, `Cannot set the log level of x to LOUD as it is not a supported log level. Valid log
levels are DEBUG, ERROR, FATAL, INFO, TRACE, WARN`); the rest INVALID_REQUEST.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from odradek.errors import InvalidConfigurationError, InvalidRequestError

log = logging.getLogger(__name__)

ROOT_LOGGER = "root"
TRACE = 5
LEVELS = {
    "TRACE": TRACE,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}
VALID_LEVELS_TEXT = ", ".join(sorted(LEVELS))
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}


def level_name(level: int) -> str:
    """A Python level as the log4j level it covers."""
    for name, number in sorted(LEVELS.items(), key=lambda item: item[1]):
        if level <= number:
            return name
    return "FATAL"


def _logger(name: str) -> logging.Logger | None:
    if name == ROOT_LOGGER:
        return logging.getLogger()
    if name not in logging.Logger.manager.loggerDict:
        return None
    return logging.getLogger(name)


def loggers() -> dict[str, str]:
    """Every logger of the process with its effective level, `root` first."""
    result = {ROOT_LOGGER: level_name(logging.getLogger().level)}
    for name in sorted(logging.Logger.manager.loggerDict):
        result[name] = level_name(logging.getLogger(name).getEffectiveLevel())
    return result


def validate(operations: Iterable[Any]) -> None:
    """Check IncrementalAlterConfigs entries (`name`, `value`, `config_operation`) for loggers."""
    for entry in operations:
        operation = int(entry.config_operation)
        name = entry.name
        if operation == OP_SET:
            if _logger(name) is None:
                raise InvalidConfigurationError(f"Logger {name} does not exist!")
            if entry.value not in LEVELS:
                raise InvalidConfigurationError(
                    f"Cannot set the log level of {name} to {entry.value} as it is not a "
                    f"supported log level. Valid log levels are {VALID_LEVELS_TEXT}"
                )
        elif operation == OP_DELETE:
            if _logger(name) is None:
                raise InvalidConfigurationError(f"Logger {name} does not exist!")
            if name == ROOT_LOGGER:
                raise InvalidRequestError(
                    f"Removing the log level of the {ROOT_LOGGER} logger is not allowed"
                )
        elif operation in _OP_NAMES:
            raise InvalidRequestError(
                f"{_OP_NAMES[operation]} operation is not allowed for the BROKER_LOGGER resource"
            )
        else:
            raise InvalidRequestError(
                f"Unknown operation type {operation} is not allowed for the BROKER_LOGGER resource"
            )


def apply(operations: Iterable[Any]) -> None:
    """Set or unset the levels (after `validate`)."""
    for entry in operations:
        logger = _logger(entry.name)
        if logger is None:
            continue
        if int(entry.config_operation) == OP_SET:
            logger.setLevel(LEVELS[entry.value])
            log.warning("Updated the log level of %s to %s", entry.name, entry.value)
        else:
            logger.setLevel(logging.NOTSET)
            log.warning("Unset the log level of %s", entry.name)
