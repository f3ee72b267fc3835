"""Controller requests written back to back (`controller/channel_manager._BrokerSender`) and applied
one after another in arrival order (`server/handlers_interbroker._controller_request`).

The broker side runs with a stand-in for the broker's services (authorizer, epoch validator); the
sender runs against a scripted server that answers in order and drops the connection once, as a
broker that restarts would."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace
from typing import Any

from odradek.controller.channel_manager import _BrokerSender
from odradek.network.client import PLAINTEXT_CLIENT
from odradek.protocol.codec import ApiKey
from odradek.server import handlers_interbroker
from odradek.zk.znodes import BrokerInfo, EndPoint


class BrokerStub:
    """What `_controller_request` reads of a broker: everything authorized, every epoch valid."""

    def __init__(self) -> None:
        accepted = SimpleNamespace(error=None)
        self.authorizer = SimpleNamespace(cluster=lambda context, operation: True)
        self.controller_validator = SimpleNamespace(check_cached=lambda *ids: accepted)
        self.broker_epoch = 5
        self.latest_controller_epoch = 0


def request_stub() -> Any:
    return SimpleNamespace(controller_id=1, controller_epoch=3, broker_epoch=5)


def context_stub(connection: str) -> Any:
    return SimpleNamespace(connection_id=connection)


def test_a_connections_controller_requests_are_applied_in_arrival_order() -> None:
    async def scenario() -> None:
        broker = BrokerStub()
        order: list[str] = []
        release = asyncio.Event()

        async def slow_apply() -> str:  # a LeaderAndIsr waiting for topic configs
            order.append("leader-and-isr started")
            await release.wait()
            order.append("leader-and-isr applied")
            return "first"

        def fast_apply() -> str:  # an UpdateMetadata: applied at once when nothing is ahead
            order.append("update-metadata applied")
            return "second"

        def refuse(code: Any) -> str:
            raise AssertionError(f"refused with {code}")

        def submit(connection: str, apply: Any) -> Any:
            return handlers_interbroker._controller_request(
                broker, context_stub(connection), request_stub(), refuse, apply
            )

        first = submit("controller:1", slow_apply)
        second = submit("controller:1", fast_apply)
        other = submit("another:2", fast_apply)  # another connection is not held back
        assert other == "second"
        assert isinstance(second, asyncio.Future)
        await asyncio.sleep(0.01)
        # the other connection's request was applied at once; this one's waits
        assert order == ["update-metadata applied", "leader-and-isr started"]
        assert not second.done()
        release.set()
        assert await first == "first"
        assert await second == "second"
        assert order[-2:] == ["leader-and-isr applied", "update-metadata applied"]
        # nothing ahead any more: the next request is applied at once, without a future
        assert submit("controller:1", fast_apply) == "second"
        assert handlers_interbroker._applying[broker] == {}

    asyncio.run(asyncio.wait_for(scenario(), 10))


class ScriptedBroker:
    """Answers UpdateMetadata v7 (error none) in order, except on its first connection: there it
    answers nothing and drops the connection once it has read the `drop_at`-th request (a sender
    that waits for each answer before writing the next never gets that far)."""

    def __init__(self, drop_at: int) -> None:
        self.drop_at = drop_at
        self.received: list[tuple[int, int]] = []  # (connection, UpdateMetadata number)
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection = self.connections
        try:
            while True:
                (length,) = struct.unpack(">i", await reader.readexactly(4))
                body = await reader.readexactly(length)
                api_key, _version, correlation_id = struct.unpack_from(">hhi", body, 0)
                assert api_key == ApiKey.UPDATE_METADATA
                number = struct.unpack_from(">i", body, len(body) - 4)[0]
                self.received.append((connection, number))
                if connection == 1:
                    if number == self.drop_at:
                        return
                    continue  # the first connection answers nothing
                # header tags, error_code none, body tags
                frame = struct.pack(">i", correlation_id) + b"\x00\x00\x00\x00"
                writer.write(struct.pack(">i", len(frame)) + frame)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()


def test_sender_writes_back_to_back_and_resends_what_was_not_answered_in_order() -> None:
    async def scenario() -> None:
        scripted = ScriptedBroker(drop_at=2)
        server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        info = BrokerInfo(7, "127.0.0.1", port, (EndPoint.plaintext("127.0.0.1", port),), None, 1)
        answers: list[int] = []
        sender = _BrokerSender(info, 1, 10.0, "PLAINTEXT", PLAINTEXT_CLIENT)
        try:
            for number in range(1, 5):
                sender.queue.put_nowait(update_metadata_item(number, answers))
            deadline = asyncio.get_running_loop().time() + 10
            while len(answers) < 4:
                assert asyncio.get_running_loop().time() < deadline, (answers, scripted.received)
                await asyncio.sleep(0.01)
        finally:
            sender.task.cancel()
            server.close()
        assert answers == [1, 2, 3, 4]  # each callback once, in order
        first = [n for c, n in scripted.received if c == 1]
        second = [n for c, n in scripted.received if c == 2]
        assert first == [1, 2]  # written without waiting for 1's answer
        assert second == [1, 2, 3, 4]  # everything unanswered resent, in order

    asyncio.run(asyncio.wait_for(scenario(), 30))


def update_metadata_item(number: int, answers: list[int]) -> Any:
    from odradek.controller.channel_manager import _QueueItem
    from odradek.protocol.codec import EncodedRequest

    # An UpdateMetadata v7 whose last four bytes carry its number (the scripted broker reads only
    # those): the sender and the connection pass the body through untouched.
    body = b"\x00" * 12 + struct.pack(">i", number)
    return _QueueItem(
        ApiKey.UPDATE_METADATA,
        7,
        EncodedRequest(None, body),
        lambda broker_id, api_key, response: answers.append(number),
    )
