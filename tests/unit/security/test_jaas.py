"""The JAAS parser: Kafka's property syntax, StreamTokenizer's quoting rules, JAAS files."""

from __future__ import annotations

import pytest

from odradek.security.errors import JaasConfigError
from odradek.security.jaas import (
    PLAIN_LOGIN_MODULE,
    ControlFlag,
    login_module,
    parse_jaas_config,
    parse_jaas_file,
    plain_users,
    server_jaas_property,
)

PLAIN = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
    'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";'
)


def test_kafkas_plain_example() -> None:
    (entry,) = parse_jaas_config(PLAIN)
    assert entry.login_module == PLAIN_LOGIN_MODULE and entry.module_name == "PlainLoginModule"
    assert entry.control_flag is ControlFlag.REQUIRED
    assert entry.options["username"] == "admin"
    assert plain_users(entry) == {"admin": "admin-secret", "alice": "alice-secret"}


def test_unquoted_words_comments_and_several_entries() -> None:
    text = """
        // the broker's own credentials
        org.apache.kafka.common.security.scram.ScramLoginModule REQUIRED
            username=broker_1 password=$ecret-word.x /* inline */ ;
        com.example.Other optional;  / lone slash comment ; =
    """
    first, second = parse_jaas_config(text)
    assert first.options == {"username": "broker_1", "password": "$ecret-word.x"}
    assert first.control_flag is ControlFlag.REQUIRED
    assert second.login_module == "com.example.Other" and second.options == {}
    assert login_module([first, second], "com.example.Other") is second


def test_quoting_rules() -> None:
    (entry,) = parse_jaas_config(
        r"""m required a="x;y=z" b='single "quoted"' c="esc\"aped\\" d="tab\there" e="\101\7" f="";"""
    )
    assert entry.options == {
        "a": "x;y=z",
        "b": 'single "quoted"',
        "c": 'esc"aped\\',
        "d": "tab\there",
        "e": "A\x07",
        "f": "",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Login module not specified"),
        ("m", "control flag not specified"),
        ("m maybe;", "Invalid login module control flag 'maybe'"),
        ("m required a=1234;", "Value not specified for key 'a'"),
        ("m required a;", "Value not specified for key 'a'"),
        ("m required a=b", "not terminated by semi-colon"),
        ('m required a="unterminated\n";', "unterminated quoted string"),
        ("m required /* never closed", "unterminated /\\* comment"),
    ],
)
def test_errors_are_kafkas(text: str, message: str) -> None:
    with pytest.raises(JaasConfigError, match=message):
        parse_jaas_config(text)


def test_jaas_file_sections() -> None:
    sections = parse_jaas_file(
        """
        KafkaServer {
            org.apache.kafka.common.security.plain.PlainLoginModule required
            user_admin="a";
        };
        Client {
            org.apache.zookeeper.server.auth.DigestLoginModule required
            username="kafka" password="zk-secret";
        };
        """
    )
    assert set(sections) == {"KafkaServer", "Client"}
    assert sections["Client"][0].options["password"] == "zk-secret"
    with pytest.raises(JaasConfigError):
        parse_jaas_file("KafkaServer { m required a=b;")


def test_listener_prefixed_property() -> None:
    props = {
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": "x required;",
        "sasl.jaas.config": "client required;",
    }
    assert server_jaas_property(props, "SASL_SSL", "SCRAM-SHA-512") == "x required;"
    assert server_jaas_property(props, "SASL_SSL", "PLAIN") is None
