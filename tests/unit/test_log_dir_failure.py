"""KIP-112 in the log layer and the controller's bookkeeping, without processes: an I/O error takes
the whole log directory offline, an offline directory's logs refuse everything, new logs go only
to live directories, nothing is written into an offline directory at shutdown, a directory that
cannot be loaded at start-up is left out; the controller learns offline replicas from
KAFKA_STORAGE_ERROR answers. (Real disks: tests/faults/disk.)"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.cluster.log_dir_failure import handle_log_dir_failure
from odradek.controller.context import ControllerContext, PartitionReplica
from odradek.controller.log_dir_events import LogDirEventManager, storage_error_partitions
from odradek.errors import KafkaStorageError, OperatorError
from odradek.log import segment as segment_module
from odradek.log.config import LogConfig
from odradek.log.log_dir_failure import LogDirFailureChannel, is_io_failure
from odradek.log.log_manager import LogManager
from odradek.log.naming import CLEAN_SHUTDOWN_FILE
from odradek.protocol.record_batch import build_batch
from odradek.protocol.topic_ids import uuid_to_topic_id
from odradek.zk.znodes import LogDirEventNotificationSequenceZNode

CONFIG = LogConfig(segment_bytes=10_000, index_interval_bytes=100)


def batch(n: int = 2) -> bytes:
    return build_batch([(None, f"v{i}".encode(), [], 1_000 + i) for i in range(n)])


def manager_with(tmp_path: Path, names: list[str]) -> tuple[LogManager, list[Path], list[Path]]:
    offline: list[Path] = []
    dirs = [tmp_path / n for n in names]
    manager = LogManager(dirs, CONFIG, failure_channel=LogDirFailureChannel(offline.append))
    manager.startup(now_ms=0)
    return manager, dirs, offline


def test_the_channel_reports_each_directory_once(tmp_path: Path):
    seen: list[Path] = []
    channel = LogDirFailureChannel(seen.append)
    assert channel.maybe_add_offline_log_dir(tmp_path / "a", "boom")
    assert not channel.maybe_add_offline_log_dir(str(tmp_path / "a"), "again")
    assert channel.has_offline_log_dir(tmp_path / "a")
    assert not channel.has_offline_log_dir(tmp_path / "b")
    assert seen == [tmp_path / "a"]
    assert is_io_failure(OSError(errno.EIO, "eio"))
    wrapped = KafkaStorageError("x")
    wrapped.__cause__ = OSError(errno.ENOSPC, "full")
    assert is_io_failure(wrapped)
    assert not is_io_failure(KafkaStorageError("closed"))


def test_an_append_that_hits_an_io_error_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    manager, (first, second), offline = manager_with(tmp_path, ["a", "b"])
    in_first = manager.get_or_create_log("t", 0)
    in_second = manager.get_or_create_log("t", 1)
    also_in_first = manager.get_or_create_log("t", 2, is_new=True)
    assert manager.log_dir_of("t", 0) == first and manager.log_dir_of("t", 1) == second
    assert manager.log_dir_of("t", 2) == first
    in_first.append_as_leader(batch(), 0, 0)

    def full(*args: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment_module.os, "pwrite", full)
    with pytest.raises(KafkaStorageError, match="No space left"):
        in_first.append_as_leader(batch(), 0, 0)
    monkeypatch.undo()
    assert offline == [Path(os.path.abspath(first))]
    # Every log of the directory refuses from now on, before touching a file...
    with pytest.raises(KafkaStorageError, match="offline"):
        also_in_first.append_as_leader(batch(), 0, 0)
    with pytest.raises(KafkaStorageError, match="offline"):
        in_first.read(0, 1000)
    # ...and the other directory works.
    in_second.append_as_leader(batch(), 0, 0)
    assert manager.handle_log_dir_failure(first) == [("t", 0), ("t", 2)]
    assert manager.live_log_dirs == [second]
    assert not manager.is_log_dir_online(first)
    # New logs go to live directories only; a replica that is not new is not created while a
    # directory that may hold it is offline.
    assert manager.get_or_create_log("u", 0, is_new=True).dir.parent == second
    with pytest.raises(KafkaStorageError, match="offline and may hold it"):
        manager.get_or_create_log("t", 0, is_new=False)
    manager.shutdown()
    assert (second / CLEAN_SHUTDOWN_FILE).exists()
    assert not (first / CLEAN_SHUTDOWN_FILE).exists()  # its logs are recovered at the next start


def test_a_directory_that_cannot_be_loaded_is_left_out_at_start_up(tmp_path: Path):
    manager, (good, bad), offline = manager_with(tmp_path, ["good", "bad"])
    manager.get_or_create_log("t", 0)
    manager.shutdown()
    blocker = tmp_path / "bad"
    shutil.rmtree(blocker)
    blocker.write_text("a file where a directory should be")  # mkdir fails: ENOTDIR/EEXIST
    manager, _, offline = manager_with(tmp_path, ["good", "bad"])
    assert offline == [Path(os.path.abspath(bad))]
    assert manager.live_log_dirs == [good]
    assert manager.get_log("t", 0) is not None
    manager.shutdown()
    with pytest.raises(OperatorError, match="none of the log directories"):
        manager_with(tmp_path, ["bad"])


def test_unreadable_meta_properties_takes_only_that_directory_offline(tmp_path: Path):
    manager, (good, bad), offline = manager_with(tmp_path, ["good", "bad"])
    manager.check_meta_properties(1, "cluster")
    (bad / "meta.properties").write_text("version=7\nbroker.id=1\n")
    manager.shutdown()
    manager, _, offline = manager_with(tmp_path, ["good", "bad"])
    manager.check_meta_properties(1, "cluster")
    assert offline == [Path(os.path.abspath(bad))]
    assert manager.live_log_dirs == [good]
    (good / "meta.properties").write_text("version=0\nbroker.id=2\ncluster.id=cluster\n")
    with pytest.raises(OperatorError, match=r"broker\.id=2"):
        manager.check_meta_properties(1, "cluster")
    manager.shutdown()


def test_an_empty_meta_properties_is_written_again(tmp_path: Path):
    manager, (only,), _ = manager_with(tmp_path, ["only"])
    (only / "meta.properties").write_text("")
    manager.check_meta_properties(3, "c")
    assert (only / "meta.properties").read_text() == "version=0\nbroker.id=3\ncluster.id=c\n"
    manager.shutdown()


def test_the_replica_manager_stops_the_partitions_of_a_failed_directory(tmp_path: Path):
    manager, (first, _), _ = manager_with(tmp_path, ["a", "b"])
    logs = {p: manager.get_or_create_log("t", p) for p in range(2)}
    failed: list[Any] = []

    class Partition:
        def __init__(self, p: int) -> None:
            self.log = logs[p]

        def make_offline(self, error: Any) -> None:
            failed.append(error)

    removed: list[Any] = []
    replica_manager = SimpleNamespace(
        partitions={("t", 0): Partition(0), ("t", 1): Partition(1)},
        offline_partitions=set(),
        log_manager=manager,
        fetcher_manager=SimpleNamespace(remove_partitions=removed.extend),
    )
    manager.failure_channel.maybe_add_offline_log_dir(first, "test")
    assert handle_log_dir_failure(replica_manager, first) == [("t", 0)]  # type: ignore[arg-type]
    assert removed == [("t", 0)]
    assert list(replica_manager.partitions) == [("t", 1)]
    assert replica_manager.offline_partitions == {("t", 0)}
    assert [e.code for e in failed] == [ErrorCode.kafka_storage_error]
    manager.shutdown()


# -- the controller's side ------------------------------------------------------------------


def _response(topic_id: uuid.UUID, errors: dict[int, ErrorCode]) -> Any:
    return SimpleNamespace(
        error_code=0,
        topics=[
            SimpleNamespace(
                topic_id=topic_id,
                partition_errors=[
                    SimpleNamespace(partition_index=p, error_code=e) for p, e in errors.items()
                ],
            )
        ],
    )


class FakeController:
    def __init__(self) -> None:
        self.offline: list[list[PartitionReplica]] = []
        self.asked: list[set[int]] = []

    async def on_replicas_become_offline(self, replicas: list[PartitionReplica]) -> None:
        self.offline.append(replicas)

    async def send_leader_and_isr_for_brokers(self, broker_ids: set[int]) -> None:
        self.asked.append(broker_ids)


class FakeZk:
    def __init__(self, children: dict[str, bytes]) -> None:
        self.children = children
        self.deleted: list[str] = []

    async def get_log_dir_event_notifications(self, watch: Any = None) -> list[str]:
        return sorted(self.children)

    async def read_log_dir_event_notifications(self, children: list[str]) -> set[int]:
        return {
            LogDirEventNotificationSequenceZNode.decode(self.children[c], 0).broker_id
            for c in children
        }

    async def delete_log_dir_event_notifications(self, children: list[str], version: int) -> None:
        self.deleted += children


def test_the_controller_marks_replicas_answered_with_storage_errors_offline():
    topic_uuid = uuid.uuid4()
    context = ControllerContext()
    context.live_brokers = {1: Any, 2: Any}  # type: ignore[dict-item]
    context.assignments = {"t": {0: (1, 2), 1: (1, 2)}}
    context.topic_ids = {"t": uuid_to_topic_id(topic_uuid)}
    zk = FakeZk(
        {
            "log_dir_event_0000000001": LogDirEventNotificationSequenceZNode.encode(1),
            "log_dir_event_0000000002": LogDirEventNotificationSequenceZNode.encode(7),
        }
    )
    controller = FakeController()
    manager = LogDirEventManager(context, zk, controller)  # type: ignore[arg-type]
    answer = _response(topic_uuid, {0: ErrorCode.kafka_storage_error, 1: ErrorCode.none})
    assert storage_error_partitions(answer, {topic_uuid: "t"}.get) == [("t", 0)]

    async def scenario() -> None:
        await manager.process_notifications(lambda e: None)
        assert controller.asked == [{1}]  # broker 7 is not live
        assert len(zk.deleted) == 2
        await manager.on_leader_and_isr_response(1, answer)
        await manager.on_leader_and_isr_response(1, answer)  # nothing new the second time
        assert controller.offline == [[PartitionReplica("t", 0, 1)]]
        assert context.brokers_with_offline_replica(("t", 0)) == {1}
        assert context.brokers_with_offline_replica(("t", 1)) == set()
        manager.on_brokers_restarted([1])
        assert context.brokers_with_offline_replica(("t", 0)) == set()

    asyncio.run(scenario())


def test_a_follower_append_that_fails_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    manager, (first, _), offline = manager_with(tmp_path, ["a", "b"])
    leader_copy = manager.get_or_create_log("source", 0)  # in a
    follower = manager.get_or_create_log("t", 0)  # in b
    leader_copy.append_as_leader(batch(), 3, 0)
    replicated = leader_copy.read(0, 1 << 20)

    def eio(*args: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(segment_module.os, "pwrite", eio)
    with pytest.raises(KafkaStorageError, match="Input/output"):
        follower.append_as_follower(replicated)
    monkeypatch.undo()
    assert offline == [follower.dir.parent.resolve()]
    assert manager.is_log_dir_online(first)
    with pytest.raises(KafkaStorageError, match="offline"):
        follower.truncate_to(0)
    manager.shutdown()


def test_the_broker_handler_notifies_the_controller_and_halts_when_no_directory_is_left(
    tmp_path: Path,
):
    from odradek.server.log_dir_failure import LogDirFailureHandler

    manager, (first, second), _ = manager_with(tmp_path, ["a", "b"])
    replica_manager = SimpleNamespace(
        partitions={}, offline_partitions=set(), log_manager=manager, fetcher_manager=None
    )

    class Zk:
        def __init__(self) -> None:
            self.created: list[Any] = []
            self.failures = 1  # the first attempt fails: the handler retries

        async def multi(self, ops: list[Any]) -> None:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("connection loss")
            self.created += ops

    zk = Zk()
    halted: list[str] = []
    handler = LogDirFailureHandler(1, lambda: replica_manager, lambda: zk, halted.append)  # type: ignore[arg-type,return-value]
    manager.failure_channel.on_offline = handler.on_offline

    async def scenario() -> None:
        manager.failure_channel.maybe_add_offline_log_dir(first, "before start")  # queued
        handler.start()
        async with asyncio.timeout(10):
            while not zk.created:
                await asyncio.sleep(0.01)
        assert LogDirEventNotificationSequenceZNode.decode(zk.created[0].data, 0).broker_id == 1
        assert not halted
        manager.failure_channel.maybe_add_offline_log_dir(second, "the last one")
        async with asyncio.timeout(10):
            while not halted:
                await asyncio.sleep(0.01)
        assert "all log directories have failed" in halted[0]
        await handler.stop()

    asyncio.run(scenario())
    manager.shutdown()
