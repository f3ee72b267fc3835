"""Topic ids: the 16-byte UUIDs of the wire protocol and the strings ZooKeeper holds.

Kafka writes a topic's id into its assignment znode (`/brokers/topics/<t>`, `"topic_id"`) and the
cluster id into `/cluster/id` as URL-safe base64 of the 16 UUID bytes without padding
("J4ZyqLNWS3iWkzs7l0IuHA"); requests and responses carry the same id as a UUID. These two
functions convert between the forms; they live here, below every layer that needs them (the
controller writes ids, the broker checks them, the handlers put them on the wire).
"""

from __future__ import annotations

import base64
import uuid


def topic_id_to_uuid(topic_id: str | None) -> uuid.UUID | None:
    """The UUID of a topic id as ZooKeeper holds it; None for none or an unreadable one."""
    if not topic_id:
        return None
    try:
        raw = base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4))
        return uuid.UUID(bytes=raw)
    except (ValueError, TypeError):
        return None


def uuid_to_topic_id(value: uuid.UUID) -> str:
    """The ZooKeeper form of a topic (or cluster) id."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")
