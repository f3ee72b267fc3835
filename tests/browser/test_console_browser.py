"""The web console driven in a real headless browser (Debian's chromium through selenium and
chromedriver), as an operator uses it: overview -> topics (filtered live by htmx) -> a topic's page
-> its records -> consumer groups -> a group's lag -> creating a topic through the confirmation
step, asserting what each page shows against what real clients did. It saves the screenshots the
README shows (docs/console-*.png).

The console runs as its own process (`odradek console --cluster-dir`), beside the session's shared
3-broker cluster, exactly as a user starts it. A second walk finds and aborts an open transaction;
a third runs the console against the shared secure cluster with `--command-config` and adds an ACL
(docs/console-transaction.png, docs/console-acls.png).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from odradek.testing import LocalCluster
from odradek.testing.console_process import ConsoleProcess
from tests.fixtures.cluster import wait_until
from tests.fixtures.secure import SecureEnv
from tests.integration._replication import create_topic, unique_topic

DOCS = Path(__file__).resolve().parents[2] / "docs"
TIMEOUT_S = 60.0

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (./dev setup installs them)",
)


@pytest.fixture(scope="module")
def console(cluster3: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log_file = tmp_path_factory.mktemp("console") / "console.log"
    process = ConsoleProcess.start(
        cluster3.directory, log_file, extra_args=["--refresh", "1", "--metrics-interval", "1"]
    )
    try:
        yield process.url
    finally:
        process.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium-manager download anything
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


def text_of(driver: object, css: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css).text  # type: ignore[attr-defined]


def shows(driver: object, css: str, expected: str) -> None:
    """Wait until the element at `css` exists and its text contains `expected`."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    def check() -> bool:
        try:
            return expected in text_of(driver, css)
        except (NoSuchElementException, StaleElementReferenceException):
            return False

    wait_until(check, TIMEOUT_S, f"{expected!r} in {css}", interval=0.2)


def test_an_operator_walks_the_console(
    console: str, browser: object, cluster3: LocalCluster
) -> None:
    from selenium.common.exceptions import NoSuchElementException
    from selenium.webdriver.common.by import By

    driver: object = browser
    find = driver.find_element  # type: ignore[attr-defined]
    topic = unique_topic("orders")
    group = unique_topic("billing")
    create_topic(cluster3, topic, [[1, 2, 3], [2, 3, 1], [3, 1, 2]], {"min.insync.replicas": "2"})
    producer = Producer({"bootstrap.servers": cluster3.bootstrap_servers, "log_level": 0})
    for i in range(60):
        producer.produce(
            topic,
            b'{"order": %d, "amount": %d}' % (i, i * 7),
            b"customer-%d" % (i % 5),
            partition=i % 3,
        )
    assert producer.flush(30) == 0
    consumer = Consumer(
        {"bootstrap.servers": cluster3.bootstrap_servers, "group.id": group, "log_level": 0}
    )
    consumer.commit(offsets=[TopicPartition(topic, p, 5) for p in range(3)], asynchronous=False)
    consumer.close()

    # Overview: brokers, controller, partition health, live throughput (htmx polling).
    driver.get(console)  # type: ignore[attr-defined]
    shows(driver, "#brokers-alive", "3 / 3")
    shows(driver, "#controller", str(cluster3.controller_id()))
    shows(driver, "#partitions-offline", "0")

    # Some traffic, for a few seconds, so the throughput charts have something to draw.
    def charted() -> bool:
        for i in range(60, 400):
            producer.produce(topic, b'{"order": %d}' % i, partition=i % 3)
        producer.flush(30)
        try:
            return "(last 6 samples)" in text_of(driver, "#throughput")
        except NoSuchElementException:
            return False

    wait_until(charted, TIMEOUT_S, "six samples of throughput", interval=0.5)
    browser.save_screenshot(str(DOCS / "console-overview.png"))  # type: ignore[attr-defined]

    # Topics: the filter narrows the table on the server, live as one types.
    find(By.LINK_TEXT, "Topics").click()
    shows(driver, "#topics", "__consumer_offsets")
    find(By.ID, "topic-query").send_keys(topic)
    shows(driver, "#topics-table", "1 topic(s) matching")
    assert "__consumer_offsets" not in text_of(driver, "#topics")
    find(By.LINK_TEXT, topic).click()

    # The topic page: partitions with leader, replicas, ISR, high watermark; its configs.
    shows(driver, "#topic-name", topic)
    shows(driver, '#partitions tr[data-partition="1"]', "2, 3, 1")
    row = text_of(driver, '#partitions tr[data-partition="0"]')
    assert row.split()[:2] == ["0", "1"], row  # partition 0, led by broker 1
    shows(driver, "#configs", "min.insync.replicas 2")
    browser.save_screenshot(str(DOCS / "console-topic.png"))  # type: ignore[attr-defined]

    # The record browser: the latest records of partition 0, then from offset 0 as JSON.
    find(By.LINK_TEXT, "Browse records").click()
    shows(driver, "#records", '{"order": 399}')  # the last record produced to partition 0
    find(By.CSS_SELECTOR, "select[name=mode] option[value=offset]").click()
    offset = find(By.CSS_SELECTOR, "input[name=offset]")
    offset.clear()
    offset.send_keys("0")
    find(By.CSS_SELECTOR, "select[name=format] option[value=json]").click()
    find(By.CSS_SELECTOR, "#record-browser button").click()
    shows(driver, '#records tr[data-offset="0"]', "customer-0")
    shows(driver, '#records tr[data-offset="0"]', '"order": 0')

    # Consumer groups: the group committed 5 on each partition.
    find(By.LINK_TEXT, "Consumer groups").click()
    shows(driver, "#groups", group)
    find(By.LINK_TEXT, group).click()
    shows(driver, "#group-state", "Empty")
    watcher = Consumer(
        {"bootstrap.servers": cluster3.bootstrap_servers, "group.id": "watermarks", "log_level": 0}
    )
    try:
        high = [
            watcher.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(3)
        ]
    finally:
        watcher.close()
    shows(driver, "#group-lag", str(sum(high) - 15))

    # Create a topic: form, then the confirmation page, then the result.
    created = unique_topic("created-in-browser")
    find(By.LINK_TEXT, "Create topic").click()
    find(By.ID, "field-topic").send_keys(created)
    partitions = find(By.ID, "field-partitions")
    partitions.clear()
    partitions.send_keys("4")
    find(By.ID, "action-review").click()
    shows(driver, "#confirm-summary", f"Create topic {created} with 4 partition(s)")
    admin = AdminClient({"bootstrap.servers": cluster3.bootstrap_servers, "log_level": 0})
    assert created not in admin.list_topics(timeout=10).topics
    find(By.ID, "action-confirm").click()
    shows(driver, "#action-result", f"Created topic {created}.")
    wait_until(lambda: created in admin.list_topics(timeout=10).topics, TIMEOUT_S)
    find(By.ID, "action-next").click()
    shows(driver, "#topic-name", created)
    shows(driver, '#partitions tr[data-partition="3"]', "3")

    # A partition's history, from its row on the topic page: the controller's state changes.
    driver.get(f"{console}topics/{topic}")  # type: ignore[attr-defined]
    find(
        By.CSS_SELECTOR, '#partitions tr[data-partition="1"] a[title="the partition\'s history"]'
    ).click()
    shows(driver, "#partition-number", "1")
    shows(driver, "#partition-leader", "2")
    shows(driver, "#state-changes", "NewPartition → OnlinePartition")
    shows(driver, "#state-changes", "leader 2, ISR [2, 3, 1]")
    shows(driver, "#state-changes", "NonExistentReplica → NewReplica")
    browser.save_screenshot(str(DOCS / "console-partition.png"))  # type: ignore[attr-defined]

    # The controller page: the active controller's queue and its last events, live.
    find(By.LINK_TEXT, "Controller").click()
    shows(driver, "#controller-id", str(cluster3.controller_id()))
    shows(driver, "#controller-queue-size", "")
    shows(driver, "#controller-recent", "ok")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#controller-recent tr[data-event]")) >= 1  # type: ignore[attr-defined]
    browser.save_screenshot(str(DOCS / "console-controller.png"))  # type: ignore[attr-defined]


def test_an_operator_finds_and_aborts_an_open_transaction(
    console: str, browser: object, cluster3: LocalCluster
) -> None:
    from selenium.webdriver.common.by import By

    driver: object = browser
    find = driver.find_element  # type: ignore[attr-defined]
    topic = unique_topic("payments")
    transactional_id = unique_topic("payments-writer")
    create_topic(cluster3, topic, [[1, 2, 3], [2, 3, 1]])
    producer = Producer(
        {
            "bootstrap.servers": cluster3.bootstrap_servers,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 600_000,  # the coordinator leaves it alone in the test
            "log_level": 0,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    try:
        producer.begin_transaction()
        for i in range(8):
            producer.produce(topic, b"payment-%d" % i, partition=i % 2)
        assert producer.flush(30) == 0

        # The ACLs page of this cluster (no authorizer) says so.
        driver.get(console)  # type: ignore[attr-defined]
        find(By.LINK_TEXT, "ACLs").click()
        shows(driver, "#acls-disabled", "SECURITY_DISABLED")

        # The transactions page: the open transaction, its producer and partitions.
        find(By.LINK_TEXT, "Transactions").click()
        shows(driver, "#transactions", transactional_id)
        row = f'#transactions tr[data-transaction="{transactional_id}"]'
        shows(driver, row, "Ongoing")
        shows(driver, row, f"{topic}-0, {topic}-1")

        # Its page: each partition's LSO held at the transaction's first offset.
        find(By.LINK_TEXT, transactional_id).click()
        shows(driver, "#transaction-state", "Ongoing")
        partition0 = f'table.producers[data-partition="{topic}-0"]'
        shows(driver, partition0, "holds the LSO")
        shows(driver, partition0, transactional_id)
        browser.save_screenshot(str(DOCS / "console-transaction.png"))  # type: ignore[attr-defined]

        # Abort it on partition 0 from the producer's row: form, confirmation, result.
        find(By.CSS_SELECTOR, f"{partition0} a.abort-link").click()
        find(By.ID, "action-review").click()
        shows(driver, "#confirm-summary", f"starts at offset 0 of {topic}-0")
        find(By.ID, "action-confirm").click()
        shows(driver, "#action-result", f"Wrote an ABORT marker on {topic}-0")
        find(By.ID, "action-next").click()

        # 4 records and the marker: the LSO reaches the high watermark, 5.
        def stable() -> bool:
            driver.refresh()  # type: ignore[attr-defined]
            return text_of(driver, ".lso") == "5" and text_of(driver, ".hw") == "5"

        wait_until(stable, TIMEOUT_S, f"{topic}-0's LSO past the aborted transaction", interval=0.5)
        shows(driver, partition0, "none open")
    finally:
        from confluent_kafka import KafkaException

        try:
            producer.abort_transaction(TIMEOUT_S)
        except KafkaException:
            pass


@pytest.fixture(scope="module")
def secure_console(
    secure_cluster: SecureEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`odradek console` against the shared secure cluster, as the super user through
    `--command-config` (Kafka's client properties: SCRAM over TLS)."""
    from odradek.testing.secure import ADMIN

    log_file = tmp_path_factory.mktemp("secure-console") / "console.log"
    process = ConsoleProcess.start(
        secure_cluster.cluster.directory,
        log_file,
        extra_args=[
            "--bootstrap-server",
            secure_cluster.identity("admin").bootstrap,
            "--command-config",
            str(secure_cluster.setup.client_properties_file(ADMIN)),
        ],
    )
    try:
        yield process.url
    finally:
        process.stop()


def test_an_operator_adds_an_acl_on_a_secure_cluster(
    secure_console: str, browser: object, secure_cluster: SecureEnv
) -> None:
    import uuid

    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver: object = browser
    find = driver.find_element  # type: ignore[attr-defined]
    principal = f"User:analyst-{uuid.uuid4().hex[:6]}"
    topic = f"sec-reports-{uuid.uuid4().hex[:6]}"
    mine = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        principal,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    admin = secure_cluster.admin()
    try:
        # The ACLs page lists what the secure cluster's fixture granted.
        driver.get(secure_console)  # type: ignore[attr-defined]
        find(By.LINK_TEXT, "ACLs").click()
        shows(driver, "#acls", "User:bob")
        shows(driver, "#acls", "PREFIXED")

        # Add one through the form and its confirmation.
        find(By.ID, "acl-add").click()
        find(By.ID, "field-principal").send_keys(principal)
        Select(find(By.ID, "field-operation")).select_by_visible_text("Read")
        Select(find(By.ID, "field-resource_type")).select_by_visible_text("Topic")
        find(By.ID, "field-resource_name").send_keys(topic)
        find(By.ID, "action-review").click()
        shows(
            driver, "#confirm-summary", f"ALLOW {principal} from any host to READ on Topic {topic}"
        )
        find(By.ID, "action-confirm").click()
        shows(driver, "#action-result", "Added the ACL")

        def granted() -> bool:
            found = admin.describe_acls(mine, request_timeout=10).result(timeout=10)
            return [(b.name, b.operation, b.permission_type) for b in found] == [
                (topic, AclOperation.READ, AclPermissionType.ALLOW)
            ]

        wait_until(granted, TIMEOUT_S, "the ACL as confluent-kafka's admin client reads it")
        find(By.ID, "action-next").click()
        shows(driver, "#acls", principal)
        # Filtered on the server: only this principal's binding.
        driver.get(f"{secure_console}acls?principal=analyst")  # type: ignore[attr-defined]
        shows(driver, "#acls-count", "1 binding(s) matching")
        driver.get(f"{secure_console}acls?type=Topic")  # type: ignore[attr-defined]
        shows(driver, "#acls", principal)
        browser.save_screenshot(str(DOCS / "console-acls.png"))  # type: ignore[attr-defined]
    finally:
        for future in admin.delete_acls([mine]).values():
            future.result(timeout=TIMEOUT_S)
