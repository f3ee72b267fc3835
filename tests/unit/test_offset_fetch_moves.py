"""OffsetFetch answered by a coordinator whose group moved away while the read waited
(coordinator/group/handlers_offsets.py).

The handler validates the group's status when the request comes, but the read ends in a later turn
of the event loop (after the group's commits in flight). A group whose offsets partition was
unloaded meanwhile reads as no offsets at all; answered as such, a client sees its committed
offsets vanish (offset -1) in the middle of a coordinator move. It must get the group's error
instead (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS), as from Kafka, which reads under the
group's lock."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.coordinator.group.handlers_offsets import handle_offset_fetch
from odradek.coordinator.group.offsets import OffsetAndMetadata
from odradek.network.request_context import RequestContext
from odradek.protocol.codec import ApiKey


class MovingCoordinator:
    """Serves the group when asked, and loses it (`then`) while the read is running."""

    def __init__(self, then: ErrorCode | None, committed: dict[Any, OffsetAndMetadata]) -> None:
        self.status: ErrorCode | None = None
        self.then = then
        self.committed = committed

    def validate_group_status(self, group_id: str, api: int) -> ErrorCode | None:
        assert api == ApiKey.OFFSET_FETCH
        return self.status

    def fetch_offsets(self, group_id: str, partitions: Any) -> tuple[ErrorCode, Any]:
        error = self.validate_group_status(group_id, ApiKey.OFFSET_FETCH)
        if error is not None:
            return error, None

        async def read() -> dict[Any, OffsetAndMetadata]:
            await asyncio.sleep(0)
            self.status = self.then  # the group's partition moves meanwhile
            return {} if self.then is not None else self.committed

        return ErrorCode.none, read()


def _fetch(coordinator: MovingCoordinator, version: int) -> Any:
    header = SimpleNamespace(
        api_key=ApiKey.OFFSET_FETCH, api_version=version, correlation_id=1, client_id="c"
    )
    context = RequestContext(header, "127.0.0.1:1", "127.0.0.1", "User:ANONYMOUS")  # type: ignore[arg-type]
    topics = [SimpleNamespace(name="t", partition_indexes=[0])]
    if version >= 8:
        request: Any = SimpleNamespace(groups=[SimpleNamespace(group_id="g", topics=topics)])
    else:
        request = SimpleNamespace(group_id="g", topics=topics)
    services = SimpleNamespace(group_coordinator=coordinator)
    return asyncio.run(handle_offset_fetch(services, context, request))  # type: ignore[arg-type]


COMMITTED = {("t", 0): OffsetAndMetadata(15)}


@pytest.mark.parametrize(
    "then", [ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress]
)
@pytest.mark.parametrize("version", [5, 8])
def test_a_group_that_moved_during_the_read_is_answered_with_its_error(
    then: ErrorCode, version: int
) -> None:
    response = _fetch(MovingCoordinator(then, COMMITTED), version)
    if version >= 8:
        (group,) = response.groups
        assert group.error_code == then
        assert list(group.topics) == []
    else:
        assert response.error_code == then
        assert list(response.topics) == []


@pytest.mark.parametrize("version", [5, 8])
def test_a_group_that_stayed_is_answered_with_its_offsets(version: int) -> None:
    response = _fetch(MovingCoordinator(None, COMMITTED), version)
    group = response.groups[0] if version >= 8 else response
    assert group.error_code == ErrorCode.none
    (topic,) = group.topics
    (partition,) = topic.partitions
    assert int(partition.committed_offset) == 15
