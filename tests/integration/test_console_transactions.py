"""The console's transactions pages and abort action against the session's shared plain 3-broker
cluster (`cluster3`), through Starlette's TestClient, and its ACLs page there (no authorizer).

A *hanging* transaction is made as KIP-890 describes the bug behind them: a producer writes a
transactional batch to a partition it never added to a transaction (Odradek, like Kafka before
KIP-890, does not check), so the partition has an open transaction no coordinator tracks. The
partition's producers page marks it hanging and holding the LSO; the abort action ends it.

A confluent-kafka transactional producer leaves a transaction open on two partitions; the
console lists it as Ongoing with its partitions, its page shows each partition's last stable
offset held at the transaction's first offset and the producer's open transaction; the abort
action (confirmation first) writes the ABORT marker on one partition, after which that
partition's LSO reaches its high watermark (as a read_committed ListOffsets sees it) while the
other partition stays held. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException
from kio.schema.errors import ErrorCode
from starlette.testclient import TestClient

from odradek.console.app import ConsoleSettings, create_app
from odradek.protocol.codec import ApiKey
from odradek.protocol.record_batch import build_batch
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._clients import create_topic, unique_topic
from tests.integration._console import confirmed
from tests.integration._replication import create_topic as create_topic_on
from tests.integration._replication import request
from tests.integration._transactions import end_offsets, txn_producer, unique_id

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def console(cluster3: LocalCluster) -> Iterator[TestClient]:
    settings = ConsoleSettings(
        bootstrap_servers=cluster3.bootstrap_servers, zookeeper=cluster3.zookeeper_connect
    )
    app = create_app(settings)
    app.state.console.zk.max_age_s = 0.2
    with TestClient(app) as client:
        yield client


def cells_of(text: str, attribute: str, value: str) -> list[str]:
    row = re.search(rf'<tr {attribute}="{re.escape(value)}">(.*?)</tr>', text, re.S)
    assert row is not None, text[-3000:]
    return [
        " ".join(re.sub(r"<[^>]+>", " ", cell).split())
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    ]


def producer_table(text: str, topic: str, partition: int) -> str:
    table = re.search(
        rf'<table class="producers" data-partition="{re.escape(topic)}-{partition}">(.*?)</table>',
        text,
        re.S,
    )
    assert table is not None, text[-3000:]
    return table.group(1)


def test_the_acls_page_of_a_cluster_without_authorizer(console: TestClient) -> None:
    text = console.get("/acls").text
    assert 'id="acls-disabled"' in text and "SECURITY_DISABLED" in text
    refused = confirmed(
        console,
        "add-acl",
        {
            "principal": "User:alice",
            "host": "*",
            "operation": "Read",
            "permission": "Allow",
            "resource_type": "Topic",
            "resource_name": "orders",
            "pattern_type": "Literal",
        },
    )
    assert refused.status_code == 502 and "SECURITY_DISABLED" in refused.text


def test_an_open_transaction_seen_and_aborted_through_the_console(
    console: TestClient, cluster3: LocalCluster
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("console-txn")
    create_topic(bootstrap, topic, partitions=2)
    transactional_id = unique_id("console-open")
    # Before any transaction of this test: the page says plainly when the topic is missing.
    first = console.get("/transactions").text
    if 'id="transactions-none"' in first:
        assert "__transaction_state</code> does not exist" in first
    # A 10-minute timeout: the coordinator will not end it within the test.
    producer = txn_producer(bootstrap, transactional_id, **{"transaction.timeout.ms": 600_000})
    try:
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, value=b"open-%d" % i, partition=0)
        producer.produce(topic, value=b"open-other", partition=1)
        assert producer.flush(TIMEOUT_S) == 0
        _check_and_abort(console, bootstrap, topic, transactional_id)
    finally:
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(TIMEOUT_S)


def _check_and_abort(
    console: TestClient, bootstrap: str, topic: str, transactional_id: str
) -> None:
    found: dict[str, str] = {}

    def listed() -> bool:
        found["text"] = console.get("/transactions?state=Ongoing").text
        return f'data-transaction="{transactional_id}"' in found["text"]

    wait_until(listed, TIMEOUT_S, "the open transaction on the console", interval=0.2)
    row = cells_of(found["text"], "data-transaction", transactional_id)
    # id, coordinator, state, producer id, epoch, timeout, started, running, partitions
    assert row[2] == "Ongoing" and row[5] == "600000 ms", row
    assert row[8] == f"{topic}-0 , {topic}-1", row
    producer_id = row[3]
    # Filtered by state on the brokers: not among the committed ones.
    assert transactional_id not in console.get("/transactions?state=CompleteCommit").text

    page = console.get(f"/transactions/{transactional_id}").text
    assert 'id="transaction-state">Ongoing<' in page
    assert f'id="transaction-partitions">{topic}-0, {topic}-1<' in page
    assert end_offsets(bootstrap, topic, 2, True) == {0: 0, 1: 0}
    assert end_offsets(bootstrap, topic, 2, False) == {0: 5, 1: 1}
    table = producer_table(page, topic, 0)
    producer_row = cells_of(table, "data-producer", producer_id)
    # producer id, epoch, last sequence, last timestamp, coordinator epoch, start offset, ...
    assert producer_row[2] == "4" and producer_row[5].startswith("0"), producer_row
    assert "holds the LSO" in producer_row[5]
    assert transactional_id in producer_row[6] and "hanging" not in producer_row[6]
    assert re.search(r'class="lso">0<', page) and re.search(r'class="hw">5<', page)

    # The abort action, through its confirmation: nothing happens before it.
    form = {"topic": topic, "partition": "0", "start_offset": "0", "producer_id": producer_id}
    review = console.post("/actions/abort-transaction", data=form)
    assert review.status_code == 200
    assert f"by producer {producer_id} that starts at offset 0 of {topic}-0" in review.text
    assert end_offsets(bootstrap, topic, 2, True) == {0: 0, 1: 0}
    wrong = confirmed(console, "abort-transaction", {**form, "start_offset": "3"})
    assert wrong.status_code == 502 and "no open transaction of producer" in wrong.text
    done = confirmed(console, "abort-transaction", form)
    assert done.status_code == 200, done.text[-2000:]
    assert f"Wrote an ABORT marker on {topic}-0 for producer {producer_id}" in done.text
    # The marker is in the log: partition 0's LSO reaches its HW (past the marker);
    # partition 1 is still held by the transaction's other half.
    wait_until(
        lambda: (
            end_offsets(bootstrap, topic, 2, True)[0]
            == end_offsets(bootstrap, topic, 2, False)[0]
            == 6
        ),
        TIMEOUT_S,
        "partition 0's LSO to pass the aborted transaction",
        interval=0.2,
    )
    assert end_offsets(bootstrap, topic, 2, True)[1] == 0
    after = console.get(f"/producers?topic={topic}&partition=0").text
    assert re.search(r'class="lso">6<', after) and re.search(r'class="hw">6<', after)
    assert "none open" in cells_of(producer_table(after, topic, 0), "data-producer", producer_id)[6]


def test_a_hanging_transaction_found_and_aborted(
    console: TestClient, cluster3: LocalCluster
) -> None:
    topic = unique_topic("console-hanging")
    create_topic_on(cluster3, topic, [[1, 2, 3]])
    leader = cluster3.broker(1)
    init = request(
        leader,
        ApiKey.INIT_PRODUCER_ID,
        4,
        {
            "transactional_id": None,
            "transaction_timeout": 60_000,
            "producer_id": -1,
            "producer_epoch": -1,
        },
    )
    assert ErrorCode(init.error_code) is ErrorCode.none
    producer_id, epoch = int(init.producer_id), int(init.producer_epoch)
    now = int(time.time() * 1000)
    batch = build_batch(
        [(None, b"hanging-%d" % i, [], now) for i in range(3)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=0,
        is_transactional=True,
    )
    answer = request(
        leader,
        ApiKey.PRODUCE,
        8,
        {
            "transactional_id": unique_id("never-initialized"),
            "acks": -1,
            "timeout": 10_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
        },
    )
    code = answer.responses[0].partition_responses[0].error_code
    assert ErrorCode(code) is ErrorCode.none, code
    bootstrap = cluster3.bootstrap_servers
    assert end_offsets(bootstrap, topic, 1, True) == {0: 0}
    assert end_offsets(bootstrap, topic, 1, False) == {0: 3}

    page = console.get(f"/producers?topic={topic}&partition=0").text
    row = cells_of(producer_table(page, topic, 0), "data-producer", str(producer_id))
    assert row[5] == "0 holds the LSO", row
    assert row[6] == "hanging no coordinator tracks it", row
    assert 'class="lso">0<' in page and 'class="hw">3<' in page
    link = re.search(
        r'href="(/actions/abort-transaction\?[^"]+)" class="abort-link button danger"', page
    )
    assert link is not None, page[-3000:]
    prefilled = console.get(link.group(1).replace("&amp;", "&")).text
    assert f'value="{producer_id}"' in prefilled and f'value="{topic}"' in prefilled

    form = {"topic": topic, "partition": "0", "start_offset": "0", "producer_id": str(producer_id)}
    done = confirmed(console, "abort-transaction", form)
    assert done.status_code == 200, done.text[-2000:]
    assert (
        f"Wrote an ABORT marker on {topic}-0 for producer {producer_id} (epoch {epoch}" in done.text
    )
    wait_until(
        lambda: (
            end_offsets(bootstrap, topic, 1, True)
            == end_offsets(bootstrap, topic, 1, False)
            == {0: 4}
        ),
        TIMEOUT_S,
        "the LSO past the aborted hanging transaction",
        interval=0.2,
    )
    after = console.get(f"/producers?topic={topic}&partition=0").text
    assert (
        "none open"
        in cells_of(producer_table(after, topic, 0), "data-producer", str(producer_id))[6]
    )
    assert "verdict-hanging" not in after
