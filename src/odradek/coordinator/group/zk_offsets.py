"""Where earlier Odradek versions stored committed offsets in ZooKeeper, and how.

`/consumers/<group>/offsets/<topic>/<partition>` holds one committed offset as ASCII decimal text
(`b"42"`), as Kafka 0.8 wrote it. Odradek kept offsets there until they moved to
`__consumer_offsets`; the group coordinator reads these znodes once, to import them
(`zk_import`). Group ids became znode names through `group_znode_name` (percent-encoded where a
character would change the path); topic names need no encoding.

Nothing here does I/O.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from odradek.zk.errors import InvalidZNodeDataError

CONSUMERS_PATH = "/consumers"


def group_znode_name(group_id: str) -> str:
    """The znode name of a group id: the id itself when it is made of letters, digits and
    `._-~` (every usual group id, so Kafka 0.8-era tools find it), else percent-encoded (a `/`
    would make a deeper path). "", "." and ".." are no valid znode names: they become "%", "%2E"
    and "%2E%2E", which percent-encoding never produces."""
    special = {"": "%", ".": "%2E", "..": "%2E%2E"}
    if group_id in special:
        return special[group_id]
    return quote(group_id, safe="")


def group_id_from_znode_name(name: str) -> str:
    special = {"%": "", "%2E": ".", "%2E%2E": ".."}
    return special[name] if name in special else unquote(name)


class ConsumerOffsetZNode:
    """`/consumers/<group>/offsets/<topic>/<partition>`: a committed offset, as decimal text.

    Topic names need no encoding: Kafka's topic name rules allow only `[a-zA-Z0-9._-]`."""

    @staticmethod
    def group_path(group_id: str) -> str:
        return f"{CONSUMERS_PATH}/{group_znode_name(group_id)}"

    @staticmethod
    def offsets_path(group_id: str) -> str:
        return f"{ConsumerOffsetZNode.group_path(group_id)}/offsets"

    @staticmethod
    def topic_path(group_id: str, topic: str) -> str:
        return f"{ConsumerOffsetZNode.offsets_path(group_id)}/{topic}"

    @staticmethod
    def path(group_id: str, topic: str, partition: int) -> str:
        return f"{ConsumerOffsetZNode.topic_path(group_id, topic)}/{partition}"

    @staticmethod
    def encode(offset: int) -> bytes:
        return str(offset).encode("ascii")

    @staticmethod
    def decode(data: bytes, path: str = "") -> int:
        try:
            return int(data.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            raise InvalidZNodeDataError(
                f"committed offset {data[:40]!r} is not a decimal number", path=path
            ) from None
