"""The project's own exceptions.

Every error that crosses a module boundary is one of these. Errors that a client must see carry the
Kafka error code (`kio.schema.errors.ErrorCode`) that the request handlers put into the response; the
handlers never invent codes of their own. Third-party errors (kazoo, kio, OS) are translated into these
at the boundary where they are raised, so callers never import a dependency's exception types.

Operator mistakes (a bad config, an unreachable ZooKeeper, a port in use) are `OperatorError`: the
command line prints their message on one line and exits non-zero, without a traceback.
"""

from __future__ import annotations

from typing import TypeVar

from kio.schema.errors import ErrorCode

T = TypeVar("T")


class OdradekError(Exception):
    """Base class of every exception raised by this project."""


class InvariantError(OdradekError):
    """An internal invariant does not hold: a bug in Odradek, not a client's or an operator's
    mistake. Raised where a bare `assert` would be stripped under `python -O`."""


def require(value: T | None, what: str) -> T:
    """`value`, which the caller's invariant says is there; InvariantError naming `what` if it
    is None (a component used before start-up or after shutdown, say)."""
    if value is None:
        raise InvariantError(f"{what} is not set")
    return value


class OperatorError(OdradekError):
    """A mistake an operator can fix: printed as one line, no traceback."""


class ConfigError(OperatorError):
    """An invalid or missing configuration property."""


class KafkaError(OdradekError):
    """An error with a Kafka protocol error code, reported to clients as that code."""

    code: ErrorCode = ErrorCode.unknown_server_error
    record_errors: tuple[tuple[int, str], ...] = ()
    """Per-record errors (index in the batch, message) for Produce v8+'s record_errors."""

    def __init__(self, message: str = "", code: ErrorCode | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        if code is not None:
            self.code = code


class CorruptRecordError(KafkaError):
    code = ErrorCode.corrupt_message


class RecordTooLargeError(KafkaError):
    code = ErrorCode.message_too_large


class RecordBatchTooLargeError(KafkaError):
    code = ErrorCode.record_list_too_large


class InvalidRecordError(KafkaError):
    code = ErrorCode.invalid_record


class OffsetOutOfRangeError(KafkaError):
    code = ErrorCode.offset_out_of_range


class UnknownTopicOrPartitionError(KafkaError):
    code = ErrorCode.unknown_topic_or_partition


class NotLeaderOrFollowerError(KafkaError):
    code = ErrorCode.not_leader_or_follower


class LeaderNotAvailableError(KafkaError):
    code = ErrorCode.leader_not_available


class InvalidTopicError(KafkaError):
    code = ErrorCode.invalid_topic_exception


class TopicAlreadyExistsError(KafkaError):
    code = ErrorCode.topic_already_exists


class InvalidPartitionsError(KafkaError):
    code = ErrorCode.invalid_partitions


class InvalidReplicationFactorError(KafkaError):
    code = ErrorCode.invalid_replication_factor


class InvalidReplicaAssignmentError(KafkaError):
    code = ErrorCode.invalid_replica_assignment


class InvalidConfigurationError(KafkaError):
    code = ErrorCode.invalid_config


class NotEnoughReplicasError(KafkaError):
    code = ErrorCode.not_enough_replicas


class NotEnoughReplicasAfterAppendError(KafkaError):
    code = ErrorCode.not_enough_replicas_after_append


class StaleControllerEpochError(KafkaError):
    code = ErrorCode.stale_controller_epoch


class FencedLeaderEpochError(KafkaError):
    code = ErrorCode.fenced_leader_epoch


class UnknownLeaderEpochError(KafkaError):
    code = ErrorCode.unknown_leader_epoch


class NotControllerError(KafkaError):
    code = ErrorCode.not_controller


class RequestTimedOutError(KafkaError):
    code = ErrorCode.request_timed_out


class InvalidRequestError(KafkaError):
    code = ErrorCode.invalid_request


class UnsupportedVersionError(KafkaError):
    code = ErrorCode.unsupported_version


class KafkaStorageError(KafkaError):
    code = ErrorCode.kafka_storage_error


class InvalidTimestampError(KafkaError):
    code = ErrorCode.invalid_timestamp


class UnsupportedCompressionTypeError(KafkaError):
    code = ErrorCode.unsupported_compression_type


class BrokerNotAvailableError(KafkaError):
    code = ErrorCode.broker_not_available


class NetworkError(OdradekError):
    """A connection to another broker failed or was closed."""


class AdminOperationError(KafkaError):
    """An admin operation that cannot be carried out as asked (Kafka's AdminOperationException).

    Raised, for example, when some brokers have a rack and others do not, so rack-aware replica
    assignment is impossible. Kafka reports it to clients as UNKNOWN_SERVER_ERROR, and so do we.
    """

    code = ErrorCode.unknown_server_error


class InvalidOffsetError(KafkaError):
    """An offset that breaks a log invariant (an index entry out of order, an offset that does not
    fit a segment). A bug or corruption, never a client mistake: reported as UNKNOWN_SERVER_ERROR."""

    code = ErrorCode.unknown_server_error


class CorruptIndexError(KafkaStorageError):
    """An offset or time index file that fails its sanity check; the log rebuilds it from the
    segment's data."""


class TopicDeletionDisabledError(KafkaError):
    code = ErrorCode.topic_deletion_disabled


class StaleBrokerEpochError(KafkaError):
    code = ErrorCode.stale_broker_epoch


class ClusterTimeoutError(OperatorError):
    """A local cluster (`odradek cluster`, `LocalCluster`) did not reach the awaited state in time:
    brokers not registered, no controller elected, a condition a test waits for never held."""


class DataSourceOptionError(ConfigError):
    """An option of the `odradek` Spark data source that is missing, malformed or not allowed in
    combination with another (the message names the option)."""


class DataLossError(OdradekError):
    """Records a Spark read was to include no longer exist: the start offset fell below the log
    start offset (retention), or a topic or partition was deleted. Raised only when the source's
    `failOnDataLoss` option is true; otherwise the reader skips to what exists and logs a warning."""


class ReadTimeoutError(OdradekError):
    """A Spark read task waited longer than `kafkaConsumer.pollTimeoutMs` without reaching the end
    of its offset range (no leader, or the high watermark did not advance to the planned end)."""


class DeliveryError(KafkaError):
    """A record the Spark sink produced was not acknowledged (`acks=all`): the broker refused it or
    the client gave up retrying. Raised in the task, so that Spark retries it."""


class DataSourceSchemaError(ConfigError):
    """A DataFrame written through the `odradek` Spark sink lacks a required column or has one of
    the wrong type (the message names the column), or a read was given a schema of its own."""


class GroupStateError(KafkaError):
    """A group coordinator invariant broke: an invalid group state transition, a member that
    should exist but does not. A bug, never a client mistake: reported as UNKNOWN_SERVER_ERROR."""

    code = ErrorCode.unknown_server_error


# Idempotent and transactional producers (the producer state of `odradek.log.producer_state`)


class OutOfOrderSequenceError(KafkaError):
    code = ErrorCode.out_of_order_sequence_number


class InvalidProducerEpochError(KafkaError):
    code = ErrorCode.invalid_producer_epoch


class InvalidTxnStateError(KafkaError):
    code = ErrorCode.invalid_txn_state


class TransactionCoordinatorFencedError(KafkaError):
    code = ErrorCode.transaction_coordinator_fenced


class CoordinatorNotAvailableError(KafkaError):
    code = ErrorCode.coordinator_not_available
