"""The console's ACLs page without a cluster: the filters and paging (pure, and through the page
handler with a fake of its admin access), what a binding row shows, SECURITY_DISABLED, and the
validation of the add and delete forms (one sentence per mistake, nothing sent)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from odradek.console import acl_pages, acl_views
from odradek.console.app import ConsoleSettings, create_app
from odradek.console.kafka_client import ConsoleError
from odradek.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tests.unit.test_console_views import snapshot_of

Op, Perm = AclOperation, AclPermissionType


def binding(
    principal: str,
    name: str,
    operation: AclOperation = Op.READ,
    resource_type: ResourceType = ResourceType.TOPIC,
    pattern_type: PatternType = PatternType.LITERAL,
    permission: AclPermissionType = Perm.ALLOW,
    host: str = "*",
) -> AclBinding:
    return AclBinding(
        ResourcePattern(resource_type, name, pattern_type),
        AccessControlEntry(principal, host, operation, permission),
    )


BINDINGS = [
    binding("User:alice", "orders"),
    binding("User:alice", "orders", Op.WRITE),
    binding("User:bob", "billing", resource_type=ResourceType.GROUP),
    binding("User:carol", "pay.", pattern_type=PatternType.PREFIXED),
    binding("User:mallory", "*", Op.ALL, permission=Perm.DENY, host="10.0.0.9"),
    binding("User:alice", "kafka-cluster", Op.IDEMPOTENT_WRITE, ResourceType.CLUSTER),
]


# -- filtering --------------------------------------------------------------------------------


def test_filter_by_principal_name_and_type() -> None:
    alice = acl_views.filter_bindings(BINDINGS, principal="ALICE")
    assert [b.entry.principal for b in alice] == ["User:alice"] * 3
    assert alice == sorted(alice)
    assert [b.pattern.name for b in acl_views.filter_bindings(BINDINGS, resource_name="ord")] == [
        "orders",
        "orders",
    ]
    groups = acl_views.filter_bindings(BINDINGS, resource_type="group")
    assert [b.entry.principal for b in groups] == ["User:bob"]
    both = acl_views.filter_bindings(BINDINGS, principal="alice", resource_type="Cluster")
    assert [b.entry.operation for b in both] == [Op.IDEMPOTENT_WRITE]
    assert acl_views.filter_bindings(BINDINGS) == sorted(BINDINGS)
    with pytest.raises(ValueError, match="Unknown resource type 'Table'"):
        acl_views.filter_bindings(BINDINGS, resource_type="Table")


def test_filter_is_fast_at_twenty_thousand_bindings() -> None:
    import time

    many = [binding(f"User:u{i}", f"topic-{i % 500}") for i in range(20_000)]
    started = time.perf_counter()
    found = acl_views.filter_bindings(many, principal="u19", resource_name="topic-1")
    assert time.perf_counter() - started < 1.0
    assert found and all("u19" in b.entry.principal for b in found)


# -- the forms --------------------------------------------------------------------------------

FORM = {
    "principal": "User:alice",
    "host": "*",
    "operation": "Read",
    "permission": "Allow",
    "resource_type": "Topic",
    "resource_name": "orders",
    "pattern_type": "Literal",
}


def test_a_good_form_is_one_binding_and_a_sentence() -> None:
    made = acl_views.binding_of(FORM)
    assert made == binding("User:alice", "orders")
    assert (
        acl_views.binding_text(made)
        == "ALLOW User:alice from any host to READ on Topic orders (LITERAL)"
    )
    # Kafka's spellings in any case, '-'/'_' ignored; an empty host is every host.
    loose = acl_views.binding_of(
        {
            **FORM,
            "operation": "describe_configs",
            "permission": "deny",
            "host": "",
            "pattern_type": "PREFIXED",
        }
    )
    assert loose.entry == AccessControlEntry("User:alice", "*", Op.DESCRIBE_CONFIGS, Perm.DENY)
    assert loose.pattern.pattern_type is PatternType.PREFIXED
    # The cluster's name is filled in, and it is always LITERAL.
    cluster = acl_views.binding_of(
        {
            **FORM,
            "resource_type": "Cluster",
            "resource_name": "",
            "operation": "IdempotentWrite",
            "pattern_type": "Prefixed",
        }
    )
    assert cluster.pattern == ResourcePattern(
        ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL
    )
    # A row's delete link names the same binding.
    for b in BINDINGS:
        assert acl_views.binding_of(acl_views.form_values(b)) == b


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"principal": "bob"}, "Invalid principal 'bob': write it as Type:name, e.g. User:bob"),
        ({"principal": ""}, "A principal is needed, e.g. User:alice"),
        ({"principal": "User:"}, "Invalid principal 'User:'"),
        ({"operation": "Fly"}, "Unknown operation 'Fly': one of All, Read, Write"),
        ({"operation": "Any"}, "Unknown operation 'Any'"),
        ({"permission": "Maybe"}, "Unknown permission 'Maybe': one of Allow, Deny"),
        ({"resource_type": "Table"}, "Unknown resource type 'Table'"),
        ({"pattern_type": "Match"}, "Unknown pattern type 'Match': one of Literal, Prefixed"),
        ({"resource_name": ""}, "A resource name is needed"),
        ({"resource_name": "a/b"}, "invalid resource name: a/b"),
        ({"operation": "IdempotentWrite"}, "ResourceType Topic only supports operations"),
        (
            {"resource_type": "Cluster", "resource_name": "prod"},
            "The cluster resource is named kafka-cluster",
        ),
    ],
)
def test_form_mistakes_are_one_sentence(change: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        acl_views.binding_of({**FORM, **change})
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


# -- the page and the actions through the app (no cluster: a fake access) ----------------------


class FakeAccess:
    def __init__(self, bindings: list[AclBinding] | None, error: str | None = None) -> None:
        self.bindings = bindings
        self.error = error
        self.created: list[AclBinding] = []
        self.deleted: list[AclBinding] = []

    async def acls(self) -> list[AclBinding] | None:
        if self.error:
            raise ConsoleError(self.error)
        return None if self.bindings is None else sorted(self.bindings)

    async def create_acl(self, b: AclBinding) -> None:
        if self.error:
            raise ConsoleError(self.error)
        self.created.append(b)

    async def delete_acl(self, b: AclBinding) -> int:
        self.deleted.append(b)
        return 1 if b in (self.bindings or []) else 0


class FakeZk:
    last_error = None

    async def current(self) -> Any:
        return snapshot_of({})

    refresh = current


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> Any:
    """(client, set_access): the app without its lifespan (no ZooKeeper), its ZooKeeper view a
    fake and its ACL access whatever the test sets."""
    app = create_app(ConsoleSettings("127.0.0.1:1", "127.0.0.1:1"))
    app.state.console.zk = FakeZk()
    holder: dict[str, Any] = {}
    monkeypatch.setattr(acl_pages, "admin_access", lambda state: holder["access"])

    def set_access(access: FakeAccess) -> FakeAccess:
        holder["access"] = access
        return access

    return TestClient(app), set_access


def cells(text: str) -> list[list[str]]:
    rows = re.findall(r"<tr data-acl=\"[^\"]*\">(.*?)</tr>", text, re.S)
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", r, re.S)]
        for r in rows
    ]


def test_the_page_lists_filters_and_pages_on_the_server(page: Any) -> None:
    client, set_access = page
    set_access(FakeAccess(BINDINGS))
    text = client.get("/acls").text
    assert "6 binding(s) of 6" in text
    rows = cells(text)
    assert ["Topic", "LITERAL", "*", "User:mallory", "10.0.0.9", "ALL", "DENY", "delete"] in rows
    assert ["Group", "LITERAL", "billing", "User:bob", "*", "READ", "ALLOW", "delete"] in rows
    filtered = client.get("/acls?principal=alice&type=Topic").text
    assert "2 binding(s) matching of 6" in filtered
    assert {r[5] for r in cells(filtered)} == {"READ", "WRITE"}
    paged = client.get("/acls?size=4&page=2").text
    assert len(cells(paged)) == 2 and "bindings 5&ndash;6 of 6" in paged
    assert 'rel="prev"' in paged and 'rel="next"' not in paged
    # Each row's delete link carries the binding.
    link = re.search(r'href="(/actions/delete-acl\?[^"]*User%3Amallory[^"]*)"', text)
    assert link is not None
    form = client.get(link.group(1).replace("&amp;", "&")).text
    assert 'value="10.0.0.9"' in form and 'value="Deny" selected' in form


def test_a_cluster_without_authorizer_is_said_plainly(page: Any) -> None:
    client, set_access = page
    set_access(FakeAccess(None))
    text = client.get("/acls").text
    assert 'id="acls-disabled"' in text and "SECURITY_DISABLED" in text
    assert 'id="acls"' not in text
    set_access(FakeAccess([], "CLUSTER_AUTHORIZATION_FAILED"))
    refused = client.get("/acls").text
    assert "DescribeAcls: CLUSTER_AUTHORIZATION_FAILED" in refused


def test_actions_validate_confirm_then_send(page: Any) -> None:
    client, set_access = page
    access = set_access(FakeAccess(list(BINDINGS)))
    bad = client.post("/actions/add-acl", data={**FORM, "principal": "bob"})
    assert bad.status_code == 400
    assert "Invalid principal &#39;bob&#39;: write it as Type:name" in bad.text
    unknown = client.post("/actions/add-acl", data={**FORM, "operation": "Fly"})
    assert unknown.status_code == 400 and "Unknown operation &#39;Fly&#39;" in unknown.text
    review = client.post("/actions/add-acl", data=FORM)
    assert (
        "Add the ACL: ALLOW User:alice from any host to READ on Topic orders (LITERAL)."
        in review.text
    )
    assert access.created == []  # nothing before the confirmation
    token = re.search(r'name="token" value="([^"]+)"', review.text)
    assert token is not None
    done = client.post(
        "/actions/add-acl", data={**FORM, "confirmed": "yes", "token": token.group(1)}
    )
    assert done.status_code == 200 and "Added the ACL" in done.text
    assert access.created == [binding("User:alice", "orders")]
    # A forged confirmation (no token) does nothing.
    forged = client.post("/actions/delete-acl", data={**FORM, "confirmed": "yes", "token": "x"})
    assert forged.status_code == 403 and access.deleted == []
    # Deleting a binding that is not there says so.
    missing = {**FORM, "principal": "User:nobody"}
    answer = client.post(
        "/actions/delete-acl", data={**missing, "confirmed": "yes", "token": token.group(1)}
    )
    assert answer.status_code == 502 and "No such ACL" in answer.text
    # The brokers' refusal is shown with Kafka's error name.
    access.error = "SECURITY_DISABLED: No Authorizer is configured"
    refused = client.post(
        "/actions/add-acl", data={**FORM, "confirmed": "yes", "token": token.group(1)}
    )
    assert refused.status_code == 502 and "SECURITY_DISABLED: No Authorizer" in refused.text
