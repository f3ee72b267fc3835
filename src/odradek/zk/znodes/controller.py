"""The controller's znodes: `/controller` (who is the controller) and `/controller_epoch` (the
fencing epoch every controller write checks).

See the package docstring for the conventions every class here follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from odradek.zk.errors import InvalidZNodeDataError
from odradek.zk.znodes._common import _dumps, _int, _loads, _now_ms

# Controller


@dataclass(frozen=True, slots=True)
class ControllerInfo:
    broker_id: int
    timestamp_ms: int
    zk_version: int


@dataclass(frozen=True, slots=True)
class ControllerEpoch:
    epoch: int
    zk_version: int


class ControllerZNode:
    """`/controller`: the ephemeral znode whose creator is the controller (JSON version 1)."""

    @staticmethod
    def path() -> str:
        return "/controller"

    @staticmethod
    def encode(broker_id: int, timestamp_ms: int | None = None) -> bytes:
        timestamp = _now_ms() if timestamp_ms is None else timestamp_ms
        return _dumps({"version": 1, "brokerid": broker_id, "timestamp": str(timestamp)})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> ControllerInfo:
        where = ControllerZNode.path()
        obj = _loads(data, where)
        timestamp = obj.get("timestamp", "-1")
        try:
            timestamp_ms = int(timestamp)
        except (TypeError, ValueError):
            timestamp_ms = -1
        return ControllerInfo(_int(obj, "brokerid", where), timestamp_ms, stat_version)


class ControllerEpochZNode:
    """`/controller_epoch`: the controller epoch as decimal text (not JSON).

    Its znode version is the fencing token: every controller write is a transaction that first
    checks this version, so a deposed controller's writes fail (see `ZkClient.checked_multi`).
    """

    @staticmethod
    def path() -> str:
        return "/controller_epoch"

    @staticmethod
    def encode(epoch: int) -> bytes:
        return str(epoch).encode("ascii")

    @staticmethod
    def decode(data: bytes, stat_version: int) -> ControllerEpoch:
        try:
            return ControllerEpoch(int(data.decode("ascii").strip()), stat_version)
        except (UnicodeDecodeError, ValueError):
            raise InvalidZNodeDataError(
                f"/controller_epoch: {data[:40]!r} is not an integer", path="/controller_epoch"
            ) from None
