"""The console's transactions pages without a cluster: the state filter, durations, which of a
partition's producers hold a hanging transaction, the pages rendered from a fake of their admin
access (including a cluster without `__transaction_state`), and the abort form's validation."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from odradek.admin.transactions import ActiveProducer, TransactionDescription, TransactionListing
from odradek.console import transaction_pages, transaction_views
from odradek.console.admin_access import PartitionTransactions, TransactionRow
from odradek.console.app import ConsoleSettings, create_app
from odradek.console.kafka_client import ConsoleError
from tests.unit.test_console_views import raw, snapshot_of


def described(
    transactional_id: str,
    producer_id: int,
    state: str = "Ongoing",
    partitions: tuple[tuple[str, int], ...] = (("t", 0),),
    start: int | None = 1_000,
) -> TransactionDescription:
    return TransactionDescription(
        transactional_id, 2, state, producer_id, 0, 60_000, start, partitions
    )


def producer(producer_id: int, start: int | None, epoch: int = 0) -> ActiveProducer:
    return ActiveProducer(producer_id, epoch, 4, 1_700_000_000_000, 3, start)


def test_state_filter_and_durations() -> None:
    assert transaction_views.state_filter("") == ()
    assert transaction_views.state_filter("ongoing") == ("Ongoing",)
    assert transaction_views.state_filter(" PrepareCommit ") == ("PrepareCommit",)
    with pytest.raises(ValueError, match="Unknown transaction state 'Open': one of Empty, Ongoing"):
        transaction_views.state_filter("Open")
    assert [
        transaction_views.duration_text(ms) for ms in (None, -1, 0, 450, 12_345, 245_000, 7_380_000)
    ] == ["-", "-", "0 ms", "450 ms", "12.3 s", "4 min 05 s", "2 h 03 min"]
    ongoing = described("a", 1, start=1_000)
    assert transaction_views.running_ms(ongoing, 61_000) == 60_000
    assert transaction_views.running_ms(described("a", 1, "CompleteCommit"), 61_000) is None
    assert transaction_views.running_ms(described("a", 1, start=None), 61_000) is None


def test_which_producers_hang() -> None:
    transactions = [
        described("tracked", 10),  # Ongoing on t-0
        described("elsewhere", 11, partitions=(("t", 1),)),  # Ongoing, but not on t-0
        described("done", 12, "CompleteAbort", partitions=()),  # ended: its open one is lost
    ]
    rows = transaction_views.producer_rows(
        "t",
        0,
        [producer(13, None), producer(12, 7), producer(10, 40), producer(11, 5), producer(99, 3)],
        transactions,
        last_stable_offset=3,
    )
    by_id = {r.producer.producer_id: r for r in rows}
    assert by_id[10].verdict == "tracked" and by_id[10].transactional_id == "tracked"
    assert by_id[11].verdict == "hanging" and by_id[11].state == "Ongoing"
    assert by_id[12].verdict == "hanging" and by_id[12].state == "CompleteAbort"
    assert by_id[99].verdict == "hanging" and by_id[99].transactional_id is None
    assert by_id[13].verdict == "none" and not by_id[13].hanging
    # Only the oldest open transaction holds the LSO; open ones first, oldest first.
    assert [r.producer.producer_id for r in rows if r.holds_lso] == [99]
    assert [r.producer.producer_id for r in rows] == [99, 11, 12, 10, 13]


# -- the pages through the app (no cluster: fakes) --------------------------------------------


class FakeAccess:
    def __init__(self) -> None:
        self.rows: list[TransactionRow] = []
        self.partition_rows: dict[tuple[str, int], PartitionTransactions] = {}
        self.aborted: list[tuple[str, int, int, int | None]] = []
        self.states_asked: list[tuple[str, ...]] = []

    async def transactions(self, states: tuple[str, ...] = ()) -> list[TransactionRow]:
        self.states_asked.append(tuple(states))
        return [r for r in self.rows if not states or r.listing.state in states]

    async def transaction(self, transactional_id: str) -> TransactionDescription:
        for r in self.rows:
            if r.listing.transactional_id == transactional_id and r.description:
                return r.description
        raise ConsoleError("TRANSACTIONAL_ID_NOT_FOUND: describing " + transactional_id)

    async def partitions(self, partitions: Any) -> list[PartitionTransactions]:
        return [self.partition_rows[p] for p in sorted(set(partitions))]

    async def abort(
        self, topic: str, partition: int, start: int, producer_id: int | None
    ) -> tuple[int, int, int]:
        self.aborted.append((topic, partition, start, producer_id))
        return 99, 0, 3


class FakeZk:
    last_error = None

    def __init__(self, topics: dict[str, Any]) -> None:
        self.snapshot = snapshot_of(topics)

    async def current(self) -> Any:
        return self.snapshot

    refresh = current


WITH_TRANSACTIONS = {
    "__transaction_state": [raw(0, [1], 1, [1])],
    "t": [raw(0, [1, 2], 1, [1, 2]), raw(1, [2, 1], 2, [2, 1])],
}


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Any:
    app = create_app(ConsoleSettings("127.0.0.1:1", "127.0.0.1:1"))
    app.state.console.zk = FakeZk(WITH_TRANSACTIONS)
    access = FakeAccess()
    monkeypatch.setattr(transaction_pages, "admin_access", lambda state: access)
    return app, access


def test_no_transaction_state_topic_is_said_plainly(app: Any) -> None:
    application, access = app
    application.state.console.zk = FakeZk({"t": [raw(0, [1], 1, [1])]})
    text = TestClient(application).get("/transactions").text
    assert 'id="transactions-none"' in text and "__transaction_state</code> does not exist" in text
    assert access.states_asked == []  # nothing asked of the brokers


def test_the_list_shows_states_producers_and_partitions(app: Any) -> None:
    application, access = app
    client = TestClient(application)
    assert 'id="transactions-empty">No transactional ids.' in client.get("/transactions").text
    access.rows = [
        TransactionRow(
            TransactionListing("app-1", 2, 10, "Ongoing"),
            described("app-1", 10, partitions=(("t", 0), ("t", 1))),
        ),
        TransactionRow(
            TransactionListing("app-2", 3, 11, "CompleteCommit"),
            described("app-2", 11, "CompleteCommit", partitions=(), start=None),
        ),
        TransactionRow(TransactionListing("app-3", 1, 12, "Ongoing"), None, "COORDINATOR_LOAD"),
    ]
    text = client.get("/transactions").text
    row = re.search(r'<tr data-transaction="app-1">(.*?)</tr>', text, re.S)
    assert row is not None
    cells = [
        " ".join(re.sub(r"<[^>]+>", "", c).split())
        for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    ]
    assert cells[:6] == ["app-1", "2", "Ongoing", "10", "0", "60000 ms"]
    assert cells[8] == "t-0, t-1"
    assert '<tr data-transaction="app-3">' in text and "COORDINATOR_LOAD" in text
    ongoing = client.get("/transactions?state=ongoing").text
    assert access.states_asked[-1] == ("Ongoing",)
    assert "app-1" in ongoing and "app-2" not in ongoing
    assert "Unknown transaction state" in client.get("/transactions?state=Open").text


def test_a_transaction_and_a_partitions_producers(app: Any) -> None:
    application, access = app
    client = TestClient(application)
    access.rows = [
        TransactionRow(TransactionListing("app-1", 2, 10, "Ongoing"), described("app-1", 10))
    ]
    access.partition_rows[("t", 0)] = PartitionTransactions(
        "t", 0, 3, 50, (producer(10, 40), producer(99, 3))
    )
    text = client.get("/transactions/app-1").text
    assert 'id="transaction-state">Ongoing<' in text
    assert 'id="transaction-partitions">t-0<' in text
    assert 'class="lso">3<' in text and 'class="hw">50<' in text
    hanging = re.search(r'<tr data-producer="99">(.*?)</tr>', text, re.S)
    assert (
        hanging is not None
        and "hanging" in hanging.group(1)
        and "holds the LSO" in hanging.group(1)
    )
    assert (
        "/actions/abort-transaction?topic=t&amp;partition=0&amp;start_offset=3&amp;producer_id=99"
        in hanging.group(1)
    )
    tracked = re.search(r'<tr data-producer="10">(.*?)</tr>', text, re.S)
    assert tracked is not None and "app-1" in tracked.group(1) and "hanging" not in tracked.group(1)
    assert client.get("/transactions/nobody").status_code == 502
    producers = client.get("/producers?topic=t&partition=0").text
    assert 'data-producer="99"' in producers
    assert client.get("/producers?topic=t&partition=5").status_code == 400
    assert client.get("/producers?topic=nope&partition=0").status_code == 404


def test_the_abort_form_is_validated_then_confirmed(app: Any) -> None:
    application, access = app
    client = TestClient(application)
    form = {"topic": "t", "partition": "0", "start_offset": "3", "producer_id": "99"}
    for change, message in (
        ({"topic": "nope"}, "Topic nope does not exist"),
        ({"partition": "2"}, "Partition 2 does not exist (t has 2)"),
        ({"start_offset": "-1"}, "The start offset must be at least 0"),
        ({"start_offset": "x"}, "The start offset must be a number, not &#39;x&#39;"),
        ({"producer_id": "p"}, "The producer id must be a number"),
    ):
        answer = client.post("/actions/abort-transaction", data={**form, **change})
        assert answer.status_code == 400 and message in answer.text, (change, answer.text[-800:])
    review = client.post("/actions/abort-transaction", data=form)
    assert "Abort the open transaction by producer 99 that starts at offset 3 of t-0" in review.text
    assert "--start-offset 3" in review.text and access.aborted == []
    token = re.search(r'name="token" value="([^"]+)"', review.text)
    assert token is not None
    done = client.post(
        "/actions/abort-transaction", data={**form, "confirmed": "yes", "token": token.group(1)}
    )
    assert (
        "Wrote an ABORT marker on t-0 for producer 99 (epoch 0, coordinator epoch 3)." in done.text
    )
    assert access.aborted == [("t", 0, 3, 99)]
