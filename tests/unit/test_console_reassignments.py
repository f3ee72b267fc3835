"""The console's reassignments page asks the brokers' metrics for the replica logs of only the
partitions being moved (`MetricsSampler.moving_logs`), and shows each new replica's progress."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.testclient import TestClient

from odradek.console.app import ConsoleSettings, create_app
from odradek.console.broker_metrics import ReplicaLog
from tests.unit.test_console_views import raw, snapshot_of


class FakeZk:
    last_error = None

    async def current(self) -> Any:
        return snapshot_of(
            {
                "orders": [
                    raw(0, [1, 2, 3], 1, [1, 2, 3]),  # not moving
                    raw(1, [1, 2, 3], 1, [1, 2], adding=[3]),
                ],
                "payments": [raw(4, [2, 3, 1], 2, [2, 3], adding=[1])],
            }
        )

    refresh = current


class FakeSampler:
    """Stricter than the real one: any scrape but `moving_logs` fails the test."""

    enabled = True

    def __init__(self) -> None:
        self.asked: list[list[tuple[str, int]]] = []

    async def moving_logs(
        self, partitions: Iterable[tuple[str, int]], wait_s: float | None = None
    ) -> tuple[dict[int, dict[tuple[str, int], ReplicaLog]], list[str]]:
        self.asked.append(sorted(partitions))
        return {
            1: {("orders", 1): ReplicaLog(1000, 10, 0)},
            3: {("orders", 1): ReplicaLog(250, 3, 0)},
        }, []


def test_the_page_scrapes_only_the_moving_partitions() -> None:
    app = create_app(ConsoleSettings("127.0.0.1:1", "127.0.0.1:1"))
    app.state.console.zk = FakeZk()
    app.state.console.metrics = sampler = FakeSampler()
    text = TestClient(app).get("/reassignments").text
    assert sampler.asked == [[("orders", 1), ("payments", 4)]]
    assert "broker 3: " in text and "25%" in text  # 250 of the leader's 1000 bytes
    assert "broker 1: -" in text  # payments-4's new replica: no log from the metrics
