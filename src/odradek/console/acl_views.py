"""The pure logic of the console's ACLs page: filtering the bindings, and reading the add and
delete forms into one `AclBinding` (or one clear sentence saying what is wrong).

No I/O here (tests/unit/test_console_acls.py). The names an operator types or picks are Kafka's
own spellings (`Topic`, `TransactionalId`, `Read`, `IdempotentWrite`, `Allow`, `Literal`), read
case-insensitively, with `-`/`_` ignored, as `odradek acls` reads `--operation`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from odradek.errors import OdradekError
from odradek.security.acl import (
    CLUSTER_NAME,
    CONCRETE_OPERATIONS,
    CONCRETE_RESOURCE_TYPES,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    check_supported_operation,
    validate_binding,
)
from odradek.security.principal import KafkaPrincipal

RESOURCE_TYPES: tuple[str, ...] = tuple(t.pascal_name for t in CONCRETE_RESOURCE_TYPES)
OPERATIONS: tuple[str, ...] = tuple(o.pascal_name for o in CONCRETE_OPERATIONS)
PERMISSIONS: tuple[str, ...] = ("Allow", "Deny")
PATTERN_TYPES: tuple[str, ...] = ("Literal", "Prefixed")


def filter_bindings(
    bindings: Iterable[AclBinding],
    principal: str = "",
    resource_name: str = "",
    resource_type: str = "",
) -> list[AclBinding]:
    """Bindings whose principal and resource name contain the given texts (case-insensitive)
    and whose resource type is `resource_type` (any when empty), sorted by resource then entry."""
    who = principal.strip().lower()
    name = resource_name.strip().lower()
    kind = _named(ResourceType, resource_type, "resource type") if resource_type.strip() else None
    return sorted(
        b
        for b in bindings
        if (not who or who in b.entry.principal.lower())
        and (not name or name in b.pattern.name.lower())
        and (kind is None or b.pattern.resource_type is kind)
    )


def _key(text: str) -> str:
    return text.replace("-", "").replace("_", "").replace(" ", "").lower()


def _named(enum_type: Any, text: str, what: str, allowed: Iterable[str] = ()) -> Any:
    """The member of `enum_type` whose Pascal-case name is `text` (among `allowed`, or every
    concrete one); ValueError naming the choices."""
    choices = tuple(allowed) or tuple(
        m.pascal_name for m in enum_type if m.name not in ("UNKNOWN", "ANY")
    )
    wanted = _key(text)
    for choice in choices:
        if _key(choice) == wanted:
            return enum_type.from_pascal_name(choice)
    shown = text.strip() or "(empty)"
    raise ValueError(f"Unknown {what} {shown!r}: one of {', '.join(choices)}")


def principal_of(text: str) -> str:
    """A principal `Type:name` (`User:alice`, `User:*`), as stored."""
    text = text.strip()
    if not text:
        raise ValueError("A principal is needed, e.g. User:alice")
    try:
        principal = KafkaPrincipal.parse(text)
    except OdradekError:
        principal = None
    if principal is None or not principal.principal_type or not principal.name:
        raise ValueError(f"Invalid principal {text!r}: write it as Type:name, e.g. User:{text}")
    return text


def binding_of(form: Mapping[str, str]) -> AclBinding:
    """The binding the add or delete form describes: principal, host, operation, permission,
    resource type, resource name and pattern type. The cluster resource's name is always
    `kafka-cluster` (filled in when left empty). ValueError with one sentence otherwise."""
    principal = principal_of(form.get("principal", ""))
    host = form.get("host", "").strip() or "*"
    operation = _named(AclOperation, form.get("operation", ""), "operation")
    permission = _named(AclPermissionType, form.get("permission", ""), "permission", PERMISSIONS)
    resource_type = _named(ResourceType, form.get("resource_type", ""), "resource type")
    pattern_type = _named(PatternType, form.get("pattern_type", ""), "pattern type", PATTERN_TYPES)
    name = form.get("resource_name", "").strip()
    if resource_type is ResourceType.CLUSTER:
        if name not in ("", CLUSTER_NAME):
            raise ValueError(f"The cluster resource is named {CLUSTER_NAME}, not {name!r}")
        name, pattern_type = CLUSTER_NAME, PatternType.LITERAL
    if not name:
        raise ValueError("A resource name is needed ('*' for every resource of the type)")
    binding = AclBinding(
        ResourcePattern(resource_type, name, pattern_type),
        AccessControlEntry(principal, host, operation, permission),
    )
    try:
        check_supported_operation(binding.pattern.resource_type, binding.entry.operation)
        validate_binding(binding)
    except OdradekError as e:
        raise ValueError(str(e)) from None
    return binding


def binding_text(binding: AclBinding) -> str:
    """`ALLOW User:alice from host * to READ on Topic orders (LITERAL)`: what a confirmation
    says."""
    p, e = binding.pattern, binding.entry
    where = "any host" if e.host == "*" else f"host {e.host}"
    return (
        f"{e.permission_type.name} {e.principal} from {where} to {e.operation.name} on "
        f"{p.resource_type.pascal_name} {p.name} ({p.pattern_type.name})"
    )


def form_values(binding: AclBinding) -> dict[str, str]:
    """The form fields naming `binding` (the delete link of a row of the ACLs table)."""
    return {
        "principal": binding.entry.principal,
        "host": binding.entry.host,
        "operation": binding.entry.operation.pascal_name,
        "permission": binding.entry.permission_type.pascal_name,
        "resource_type": binding.pattern.resource_type.pascal_name,
        "resource_name": binding.pattern.name,
        "pattern_type": binding.pattern.pattern_type.pascal_name,
    }
