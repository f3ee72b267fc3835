"""What an append did (`LogAppendInfo`), as `Log.append_as_leader` and `append_as_follower`
return it, and how it is computed from the appended batches' headers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from odradek.protocol.record_batch import NO_TIMESTAMP, BatchHeader


@dataclass(frozen=True, slots=True)
class LogAppendInfo:
    """What an append did. Offsets are -1 when there was nothing to append; `batch_count` 0 with
    offsets set means a producer's retry of a batch already in the log (its original offsets),
    not appended again."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time: int
    """The broker's timestamp when the topic uses LogAppendTime, else -1."""
    batch_count: int
    size: int
    log_start_offset: int

    @property
    def record_count(self) -> int:
        return 0 if self.batch_count == 0 else self.last_offset - self.first_offset + 1


def append_info(
    headers: Sequence[BatchHeader], size: int, log_append_time: int, log_start_offset: int
) -> LogAppendInfo:
    max_timestamp, offset_of_max = NO_TIMESTAMP, -1
    for header in headers:
        if header.max_timestamp > max_timestamp:
            max_timestamp = header.max_timestamp
            offset_of_max = header.base_offset + header.last_offset_delta
    first, last = headers[0], headers[-1]
    return LogAppendInfo(
        first_offset=first.base_offset,
        last_offset=last.base_offset + last.last_offset_delta,
        max_timestamp=max_timestamp,
        offset_of_max_timestamp=offset_of_max,
        log_append_time=log_append_time,
        batch_count=len(headers),
        size=size,
        log_start_offset=log_start_offset,
    )
