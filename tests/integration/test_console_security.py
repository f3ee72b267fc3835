"""The console's ACLs page and actions against the shared secure 3-broker cluster
(`tests.fixtures.secure`: SASL_SSL, Kafka's ACL authorizer, `User:admin` the only super user).

The console is configured as an operator starts it, through `odradek console`'s own argument
handling with `--command-config admin.properties` (Kafka's Java client properties: SCRAM over TLS
with a PEM truststore), and driven through Starlette's TestClient. What it lists and what its
actions did is checked with an independent client (confluent-kafka's admin API as the super
user). A console connected as a user without Alter on the cluster shows the brokers' refusal
with Kafka's error name. Every ACL made here is removed again (the cluster is shared).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from starlette.testclient import TestClient

from odradek.cli.console import settings_from
from odradek.cli.main import build_parser
from odradek.console.app import create_app
from odradek.testing.secure import ADMIN, CLIENT, PLAIN_USER
from tests.fixtures.cluster import wait_until
from tests.fixtures.secure import SecureEnv
from tests.integration._console import confirmed

TIMEOUT_S = 30.0


def console_for(env: SecureEnv, properties: Path) -> TestClient:
    args = build_parser().parse_args(
        [
            "console",
            "--bootstrap-server",
            env.identity("admin").bootstrap,
            "--zookeeper",
            env.cluster.zookeeper_connect,
            "--command-config",
            str(properties),
        ]
    )
    app = create_app(settings_from(args))
    app.state.console.zk.max_age_s = 0.2
    return TestClient(app)


@pytest.fixture(scope="module")
def console(secure_cluster: SecureEnv) -> Iterator[TestClient]:
    with console_for(secure_cluster, secure_cluster.setup.client_properties_file(ADMIN)) as c:
        yield c


def acl_rows(text: str) -> list[list[str]]:
    rows = re.findall(r'<tr data-acl="[^"]*">(.*?)</tr>', text, re.S)
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", row, re.S)][:7]
        for row in rows
    ]


def described(env: SecureEnv, principal: str) -> set[tuple[str, str, str, str, str, str, str]]:
    """The bindings of `principal` as the super user's confluent-kafka admin client reads them."""
    admin = env.admin()
    found = admin.describe_acls(
        AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            principal,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        ),
        request_timeout=TIMEOUT_S,
    ).result(timeout=TIMEOUT_S)
    return {
        (
            b.restype.name,
            b.resource_pattern_type.name,
            b.name,
            b.principal,
            b.host,
            b.operation.name,
            b.permission_type.name,
        )
        for b in found
    }


def test_the_acls_page_lists_the_clusters_bindings(
    console: TestClient, secure_cluster: SecureEnv
) -> None:
    # The fixture granted these with confluent-kafka: ALL on sec-* topics and groups.
    text = console.get(f"/acls?principal=User:{PLAIN_USER}").text
    assert 'id="acls-disabled"' not in text and 'id="acls-error"' not in text, text[-2000:]
    rows = acl_rows(text)
    assert ["Topic", "PREFIXED", "sec-", f"User:{PLAIN_USER}", "*", "ALL", "ALLOW"] in rows
    assert ["Group", "PREFIXED", "sec-", f"User:{PLAIN_USER}", "*", "ALL", "ALLOW"] in rows
    assert len(rows) == len(described(secure_cluster, f"User:{PLAIN_USER}"))
    groups = acl_rows(console.get(f"/acls?principal={PLAIN_USER}&type=Group").text)
    assert groups == [["Group", "PREFIXED", "sec-", f"User:{PLAIN_USER}", "*", "ALL", "ALLOW"]]


def test_add_and_delete_an_acl_through_the_confirmation(
    console: TestClient, secure_cluster: SecureEnv
) -> None:
    user = f"User:console-{uuid.uuid4().hex[:8]}"
    topic = f"sec-console-{uuid.uuid4().hex[:8]}"
    form = {
        "principal": user,
        "host": "10.1.2.3",
        "operation": "Write",
        "permission": "Deny",
        "resource_type": "Topic",
        "resource_name": topic,
        "pattern_type": "Literal",
    }
    expected = ("TOPIC", "LITERAL", topic, user, "10.1.2.3", "WRITE", "DENY")
    # Mistakes are one sentence, and nothing is sent.
    bad = console.post("/actions/add-acl", data={**form, "principal": user.removeprefix("User:")})
    assert bad.status_code == 400 and "write it as Type:name" in bad.text
    unknown = console.post("/actions/add-acl", data={**form, "operation": "Publish"})
    assert unknown.status_code == 400 and "Unknown operation &#39;Publish&#39;" in unknown.text
    review = console.post("/actions/add-acl", data=form)
    assert f"Add the ACL: DENY {user} from host 10.1.2.3 to WRITE on Topic {topic}" in review.text
    assert described(secure_cluster, user) == set()
    page_row = ["Topic", "LITERAL", topic, user, "10.1.2.3", "WRITE", "DENY"]
    try:
        done = confirmed(console, "add-acl", form)
        assert done.status_code == 200 and "Added the ACL" in done.text, done.text[-2000:]
        # Every broker's authorizer cache follows ZooKeeper's change notification.
        wait_until(
            lambda: described(secure_cluster, user) == {expected},
            TIMEOUT_S,
            "the ACL as the admin client reads it",
            interval=0.2,
        )
        wait_until(
            lambda: page_row in acl_rows(console.get(f"/acls?name={topic}").text),
            TIMEOUT_S,
            "the new ACL on the console's page",
            interval=0.2,
        )
        # Deleting goes through the row's own link, pre-filled.
        page = console.get(f"/acls?name={topic}").text
        link = re.search(r'href="(/actions/delete-acl\?[^"]+)"', page)
        assert link is not None
        prefilled = console.get(link.group(1).replace("&amp;", "&")).text
        assert f'value="{topic}"' in prefilled and 'value="Deny" selected' in prefilled
        gone = confirmed(console, "delete-acl", form)
        assert gone.status_code == 200 and "Deleted the ACL" in gone.text, gone.text[-2000:]
        wait_until(
            lambda: described(secure_cluster, user) == set(),
            TIMEOUT_S,
            "the ACL gone as the admin client reads it",
            interval=0.2,
        )
        again = confirmed(console, "delete-acl", form)
        assert again.status_code == 502 and "No such ACL" in again.text
    finally:
        _remove_all_of(secure_cluster, user)


def _remove_all_of(env: SecureEnv, principal: str) -> None:
    admin = env.admin()
    acl_filter = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        principal,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    for future in admin.delete_acls([acl_filter]).values():
        future.result(timeout=TIMEOUT_S)


def test_a_console_without_alter_on_the_cluster_shows_the_refusal(
    secure_cluster: SecureEnv,
) -> None:
    # User `client` may do everything on topics and groups, nothing on the cluster.
    properties = secure_cluster.setup.client_properties_file(CLIENT)
    user = f"User:console-{uuid.uuid4().hex[:8]}"
    with console_for(secure_cluster, properties) as limited:
        page = limited.get("/acls").text
        assert "DescribeAcls: CLUSTER_AUTHORIZATION_FAILED" in page, page[-2000:]
        form = {
            "principal": user,
            "host": "*",
            "operation": "Read",
            "permission": "Allow",
            "resource_type": "Group",
            "resource_name": "sec-anything",
            "pattern_type": "Literal",
        }
        refused = confirmed(limited, "add-acl", form)
        assert refused.status_code == 502
        assert "CLUSTER_AUTHORIZATION_FAILED" in refused.text, refused.text[-2000:]
    assert described(secure_cluster, user) == set()


def test_the_transactions_pages_talk_to_every_broker_securely(
    console: TestClient, secure_cluster: SecureEnv
) -> None:
    """A partition's producers page asks its leader (ListOffsets, DescribeProducers) and every
    broker (ListTransactions): connections beyond the bootstrap one, each authenticated."""
    from confluent_kafka.admin import NewTopic

    topic = f"sec-console-txn-{uuid.uuid4().hex[:8]}"
    admin = secure_cluster.admin()
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(timeout=TIMEOUT_S)
    try:
        found: dict[int, str] = {}

        def shown(partition: int) -> bool:
            answer = console.get(f"/producers?topic={topic}&partition={partition}")
            found[partition] = answer.text
            return answer.status_code == 200 and 'class="lso">0<' in answer.text

        for partition in range(3):  # led by different brokers
            wait_until(
                lambda p=partition: shown(p),
                TIMEOUT_S,
                f"{topic}-{partition}'s producers page",
                interval=0.2,
            )
            text = found[partition]
            assert 'class="hw">0<' in text and "No active producers" in text
            assert 'class="error"' not in text, text[-2000:]
    finally:
        admin.delete_topics([topic])[topic].result(timeout=TIMEOUT_S)
