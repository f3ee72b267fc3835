"""The steps of following Kafka's config change notifications (`/config/changes/config_change_<seq>`,
each naming an entity whose config znode changed), shared by the readers of dynamic configs in
`server/quota/`: the client quota store (`store.py`) and the replication throttle follower
(`replication.py`). As Kafka's DynamicConfigManager, a reader:

1. sets the child watch on `/config/changes` and takes the notifications present then as done
   (`skip_announced_changes`: the reader's full load, which follows, covers them);
2. on each fired watch, reads the notifications after the last one done, in sequence order
   (`new_config_changes`), and re-reads the entities it cares about. A notification deleted
   meanwhile is skipped; a corrupt one is logged and skipped: neither stops the ones after it.

Readers never delete notifications. Concurrency: the caller's task, under the caller's lock.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from odradek.security.notifications import NotificationTracker
from odradek.zk.client import ZkClient
from odradek.zk.errors import InvalidZNodeDataError, NoNodeError
from odradek.zk.znodes import (
    ConfigChangeNotification,
    ConfigChangeNotificationSequenceZNode,
    ConfigChangeNotificationZNode,
)

log = logging.getLogger(__name__)


async def skip_announced_changes(
    zk: ZkClient, tracker: NotificationTracker, watch: Callable[[Any], None]
) -> None:
    """Step 1: watch `/config/changes` and mark every notification there now as done."""
    children = await zk.get_children(ConfigChangeNotificationZNode.path(), watch=watch)
    for child in tracker.new_children(children):
        tracker.processed(child)


async def new_config_changes(
    zk: ZkClient, tracker: NotificationTracker, watch: Callable[[Any], None]
) -> AsyncIterator[tuple[str, ConfigChangeNotification]]:
    """Step 2: (child name, notification) for each notification not done yet, oldest first, with
    the watch set again. Each is marked done once the caller's loop body for it has finished (not
    if the body raises: the next pass sees it again)."""
    parent = ConfigChangeNotificationZNode.path()
    children = await zk.get_children(parent, watch=watch)
    for child in tracker.new_children(children):
        change = None
        try:
            data, stat = await zk.get(f"{parent}/{child}")
            change = ConfigChangeNotificationSequenceZNode.decode(data, stat.version)
        except NoNodeError:
            pass
        except InvalidZNodeDataError as e:
            log.error("ignoring config change notification %s: %s", child, e)
        if change is not None:
            yield child, change
        tracker.processed(child)
