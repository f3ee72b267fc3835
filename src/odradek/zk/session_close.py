"""Ending a ZooKeeper session from another connection, given its id and password.

What it is for: a broker process that was killed leaves its session open on the server until
`zookeeper.session.timeout.ms` passes, and with it its ephemeral `/brokers/ids/<id>` (and
`/controller` if it was the controller). The next process of that broker knows the session's id
and password (it reads them from its log directory) and ends it at once instead of waiting.
ZooKeeper's own tests expire sessions the same way.

How, on the wire (`bulk_read.WireSession`, asyncio streams, no kazoo threads): a ConnectRequest
naming the session id and password re-attaches the session to the new connection. ZooKeeper
answers with a positive timeout if the session is alive and the password is its own; otherwise
with timeout 0 (the session expired or was closed, or the password is wrong), and closes the
connection. A closeSession on the re-attached session is answered once the closing transaction
has committed, which deletes every ephemeral znode of the session in the same step.

Why not kazoo: given a session id that has expired, kazoo reports nothing to the caller; it
quietly opens a new session and carries on, and `start()` succeeds either way.

We ask for a short session timeout (the server raises it to its minimum): re-attaching resets the
session's expiry clock to that timeout, so if our connection breaks before closeSession is
answered the session expires sooner than it would have, never later.
"""

from __future__ import annotations

import asyncio
import random
import struct

from odradek.zk.bulk_read import WireSession, split_connect_string
from odradek.zk.errors import ConnectionLossError, SessionExpiredError

ATTACH_SESSION_TIMEOUT_MS = 1000


async def close_session(
    connect_string: str, session_id: int, password: bytes, *, timeout_s: float = 5.0
) -> bool:
    """End the session `session_id` (its ephemeral znodes go with it).

    True: it was alive and is closed now. False: ZooKeeper says it is not alive (expired, closed,
    or `password` is not its own): nothing was changed. ConnectionLossError: no server answered
    within `timeout_s` (the session may still be alive). The connect string's chroot is ignored:
    sessions belong to the ensemble, not to a path."""
    hosts, _chroot = split_connect_string(connect_string)
    random.shuffle(hosts)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last_error: BaseException | None = None
    for host, port in hosts:
        try:
            async with asyncio.timeout_at(deadline):
                session = await WireSession.open(
                    host,
                    port,
                    ATTACH_SESSION_TIMEOUT_MS,
                    session_id=session_id,
                    password=password,
                )
                await session.close_confirmed()
                return True
        except SessionExpiredError:
            # Authoritative from any member: a follower asks the leader to revalidate the session.
            return False
        except (OSError, ConnectionError, TimeoutError, struct.error, ConnectionLossError) as e:
            last_error = e
            if loop.time() >= deadline:
                break
    raise ConnectionLossError(
        f"cannot reach ZooKeeper to close session 0x{session_id:x}: {last_error}"
    )
