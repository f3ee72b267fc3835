"""The console's ACLs page (`/acls`) and its two actions, adding an ACL and deleting a binding.

The page lists every binding the cluster's authorizer holds (DescribeAcls with a match-any
filter): resource type, pattern type, name, principal, host, operation, permission; filtered on
the server by principal, resource name and resource type, 50 a page like the topics list. A
cluster without an authorizer answers SECURITY_DISABLED, and the page says so. The principal the
console connects as (`--command-config`) needs Describe on the cluster to list and Alter to
change; a refusal is shown with Kafka's error name.

The actions are the console's usual form -> confirmation -> request (`actions`): `add-acl` sends
CreateAcls with the one binding the form describes, `delete-acl` DeleteAcls with a filter that
matches exactly one binding (each row of the table links to it pre-filled).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from odradek.console import acl_views, views
from odradek.console.actions import Action, Field, Plan
from odradek.console.admin_access import admin_access
from odradek.console.kafka_client import ConsoleError


async def acls(request: Request) -> Response:
    state = request.app.state.console
    params = request.query_params
    principal = params.get("principal", "")
    resource_name = params.get("name", "")
    resource_type = params.get("type", "")
    number = views.parse_int(params.get("page"), 1, 1, 1_000_000)
    size = views.parse_int(params.get("size"), views.DEFAULT_PAGE_SIZE, 1, views.MAX_PAGE_SIZE)
    bindings: list[Any] | None = []
    error = None
    try:
        bindings = await admin_access(state).acls()
    except ConsoleError as e:
        error = str(e)
    matching: list[Any] = []
    if bindings:
        try:
            matching = acl_views.filter_bindings(bindings, principal, resource_name, resource_type)
        except ValueError as e:
            error = str(e)
    page = views.paginate(matching, number, size)
    rows = [{"binding": b, "delete": urlencode(acl_views.form_values(b))} for b in page.items]
    query = urlencode({"principal": principal, "name": resource_name, "type": resource_type})
    return state.render(
        request,
        "acls.html",
        security_disabled=bindings is None,
        total=len(bindings or []),
        page=page,
        rows=rows,
        error=error,
        principal=principal,
        name=resource_name,
        type=resource_type,
        resource_types=acl_views.RESOURCE_TYPES,
        query=query,
    )


# -- actions ----------------------------------------------------------------------------------


def _plan_add(form: Mapping[str, str], snapshot: Any) -> Plan:
    binding = acl_views.binding_of(form)
    return Plan(
        {"binding": binding},
        [
            f"Add the ACL: {acl_views.binding_text(binding)}.",
            "Sent as CreateAcls; every broker's authorizer applies it within a moment.",
        ],
    )


async def _run_add(state: Any, p: dict[str, Any]) -> tuple[str, str]:
    binding = p["binding"]
    await admin_access(state).create_acl(binding)
    return (
        f"Added the ACL: {acl_views.binding_text(binding)}.",
        "/acls?" + urlencode({"principal": binding.entry.principal, "name": binding.pattern.name}),
    )


def _plan_delete(form: Mapping[str, str], snapshot: Any) -> Plan:
    binding = acl_views.binding_of(form)
    return Plan(
        {"binding": binding},
        [
            f"Delete the ACL: {acl_views.binding_text(binding)}.",
            "Sent as DeleteAcls with a filter matching exactly this binding; what it allowed (or"
            " denied) stops being allowed (denied) within a moment on every broker.",
        ],
    )


async def _run_delete(state: Any, p: dict[str, Any]) -> tuple[str, str]:
    binding = p["binding"]
    deleted = await admin_access(state).delete_acl(binding)
    if not deleted:
        raise ConsoleError(f"No such ACL: {acl_views.binding_text(binding)} (nothing was deleted)")
    return f"Deleted the ACL: {acl_views.binding_text(binding)}.", "/acls"


FIELDS = (
    Field("principal", "Principal", placeholder="User:alice"),
    Field("host", "Host", placeholder="* or an IP address", default="*"),
    Field("operation", "Operation", "select", acl_views.OPERATIONS, default="Read"),
    Field("permission", "Permission", "select", acl_views.PERMISSIONS, default="Allow"),
    Field("resource_type", "Resource type", "select", acl_views.RESOURCE_TYPES, default="Topic"),
    Field(
        "resource_name",
        "Resource name",
        placeholder="a name, a prefix, or * (kafka-cluster for the cluster)",
        required=False,
    ),
    Field("pattern_type", "Pattern type", "select", acl_views.PATTERN_TYPES, default="Literal"),
)
ACTIONS = (
    Action("add-acl", "Add an ACL", FIELDS, _plan_add, _run_add),
    Action("delete-acl", "Delete an ACL", FIELDS, _plan_delete, _run_delete, danger=True),
)


def routes() -> list[Route]:
    return [Route("/acls", acls)]
