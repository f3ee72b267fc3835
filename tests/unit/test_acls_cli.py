"""`odradek acls` and `odradek configs`: what the arguments mean, before anything is sent."""

from __future__ import annotations

import argparse

import pytest

from odradek.cli import acls, configs
from odradek.errors import OperatorError
from odradek.security.acl import AclOperation, AclPermissionType, PatternType, ResourceType


def _acls(*argv: str) -> acls.AclsCommand:
    parser = argparse.ArgumentParser()
    acls.add_parser(parser.add_subparsers())
    return acls.validate(parser.parse_args(["acls", "--bootstrap-server", "h:1", *argv]))


def _configs(*argv: str) -> configs.ConfigsCommand:
    parser = argparse.ArgumentParser()
    configs.add_parser(parser.add_subparsers())
    return configs.validate(parser.parse_args(["configs", *argv]))


def _described(command: acls.AclsCommand) -> set[tuple[str, str, str, str, str, str]]:
    return {
        (
            b.pattern.resource_type.name,
            b.pattern.name,
            b.pattern.pattern_type.name,
            b.entry.principal,
            b.entry.operation.name,
            b.entry.permission_type.name,
        )
        for b in command.bindings
    }


def test_add_is_every_combination_of_principal_host_operation_and_resource() -> None:
    command = _acls(
        "--add",
        "--allow-principal", "User:alice",
        "--allow-principal", "User:bob",
        "--operation", "Read",
        "--operation", "describe",
        "--topic", "t",
        "--group", "g",
    )  # fmt: skip
    assert len(command.bindings) == 8
    assert all(b.entry.host == "*" for b in command.bindings)
    assert ("GROUP", "g", "LITERAL", "User:bob", "DESCRIBE", "ALLOW") in _described(command)


def test_producer_and_consumer_shortcuts() -> None:
    producer = _acls(
        "--add", "--allow-principal", "User:p", "--producer", "--topic", "t", "--idempotent"
    )
    assert {(r, op) for r, _, _, _, op, _ in _described(producer)} == {
        ("TOPIC", "WRITE"),
        ("TOPIC", "DESCRIBE"),
        ("TOPIC", "CREATE"),
        ("CLUSTER", "IDEMPOTENT_WRITE"),
    }
    consumer = _acls(
        "--add", "--allow-principal", "User:c", "--consumer", "--topic", "t", "--group", "g"
    )
    assert {(r, op) for r, _, _, _, op, _ in _described(consumer)} == {
        ("TOPIC", "READ"),
        ("TOPIC", "DESCRIBE"),
        ("GROUP", "READ"),
    }


def test_deny_prefixed_and_remove_everything_of_a_resource() -> None:
    deny = _acls(
        "--add",
        "--deny-principal", "User:m",
        "--deny-host", "10.0.0.1",
        "--operation", "Write",
        "--topic", "pay",
        "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    (binding,) = deny.bindings
    assert binding.pattern.pattern_type is PatternType.PREFIXED
    assert (binding.entry.host, binding.entry.permission_type) == (
        "10.0.0.1",
        AclPermissionType.DENY,
    )
    remove = _acls("--remove", "--topic", "t", "--force")
    assert remove.remove_all and remove.resources[0].resource_type is ResourceType.TOPIC


@pytest.mark.parametrize(
    "argv, problem",
    [
        (
            ("--add", "--allow-principal", "User:a", "--operation", "Read", "--cluster"),
            "only supports",
        ),
        (("--add", "--topic", "t"), "needs --allow-principal"),
        (("--add", "--allow-principal", "User:a", "--consumer", "--topic", "t"), "--group"),
        (("--add", "--allow-principal", "alice", "--topic", "t"), "invalid principal"),
        (
            ("--add", "--allow-principal", "User:a", "--operation", "Fly", "--topic", "t"),
            "invalid --operation",
        ),
        (
            (
                "--add",
                "--allow-principal",
                "User:a",
                "--topic",
                "t",
                "--resource-pattern-type",
                "match",
            ),
            "not valid",
        ),
    ],
)
def test_acls_mistakes(argv: tuple[str, ...], problem: str) -> None:
    with pytest.raises(OperatorError, match=problem):
        _acls(*argv)


def test_configs_users() -> None:
    command = _configs(
        "--bootstrap-server", "h:1",
        "--entity-type", "users",
        "--entity-name", "alice",
        "--alter",
        "--add-config", "SCRAM-SHA-256=[iterations=8192,password=a,b=c],SCRAM-SHA-512=[password=x]",
    )  # fmt: skip
    assert command.add_config == {
        "SCRAM-SHA-256": "iterations=8192,password=a,b=c",
        "SCRAM-SHA-512": "password=x",
    }
    assert configs._iterations_and_password(command.add_config["SCRAM-SHA-256"]) == (8192, "a,b=c")
    with pytest.raises(OperatorError, match="iterations must be between"):
        _configs(
            "--bootstrap-server", "h:1", "--entity-type", "users", "--entity-name", "a",
            "--alter", "--add-config", "SCRAM-SHA-256=[iterations=10,password=x]",
        )  # fmt: skip
    with pytest.raises(OperatorError, match="not supported"):
        _configs("--bootstrap-server", "h:1", "--entity-type", "widgets", "--describe")
    with pytest.raises(OperatorError, match="quotas are not implemented"):
        _configs(
            "--zookeeper", "h:2181", "--entity-type", "users", "--entity-name", "a",
            "--alter", "--add-config", "producer_byte_rate=1024",
        )  # fmt: skip
    assert AclOperation.ALL  # the enum the CLI maps names onto
