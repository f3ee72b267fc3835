"""The brokers' JSON endpoints beside `/metrics` (`/state-changes`, `/controller-events`; see
`odradek.server.metrics.json_endpoints`), as the console asks them.

A broker's JSON endpoints live on the same listener as its `/metrics`, so the console derives
their address from the metrics address it was given (`http://h:9404/metrics` ->
`http://h:9404/state-changes?...`): nothing more to configure, and a remote cluster works as long
as the console can reach the metrics listeners. Requests run in worker threads with a timeout and a
size cap; a broker that cannot be asked, or answers something that is not JSON, becomes a
`BrokerAnswer` carrying the error rather than an exception.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 3.0
MAX_ANSWER_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BrokerAnswer:
    """One broker's answer: `value` (decoded JSON) or `error` (why there is none)."""

    broker_id: int
    value: Any = None
    error: str | None = None


def json_url(metrics_url: str, path: str, params: Mapping[str, str | int] | None = None) -> str:
    """The address of the JSON endpoint `path` on the listener serving `metrics_url`."""
    parts = urllib.parse.urlsplit(metrics_url)
    query = urllib.parse.urlencode(params or {})
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def _get(broker_id: int, url: str) -> BrokerAnswer:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            body = answer.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as e:
        reason = e.read(300).decode("utf-8", "replace").strip()
        return BrokerAnswer(broker_id, error=f"{url}: HTTP {e.code} {reason}")
    except (OSError, ValueError) as e:
        return BrokerAnswer(broker_id, error=f"{url}: {e}")
    if len(body) > MAX_ANSWER_BYTES:
        return BrokerAnswer(broker_id, error=f"{url}: answer larger than {MAX_ANSWER_BYTES} bytes")
    try:
        return BrokerAnswer(broker_id, value=json.loads(body))
    except ValueError as e:
        return BrokerAnswer(broker_id, error=f"{url}: not JSON ({e})")


async def ask(
    endpoints: Mapping[int, str], path: str, params: Mapping[str, str | int] | None = None
) -> dict[int, BrokerAnswer]:
    """Ask each broker's `path` at once (worker threads); every broker gets an answer."""
    answers = await asyncio.gather(
        *(
            asyncio.to_thread(_get, broker_id, json_url(url, path, params))
            for broker_id, url in sorted(endpoints.items())
        )
    )
    return {a.broker_id: a for a in answers}
