"""DNs as Java's X500Principal.getName() prints them, and Kafka's principal mapping rules
(cases ported from Kafka's SslPrincipalMapperTest)."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID

from odradek.security.errors import NoMatchingRuleError, PrincipalMappingError
from odradek.security.principal import ANONYMOUS
from odradek.security.principal_mapping import (
    SslPrincipalMapper,
    parse_rules,
    principal_from_certificate,
    rfc2253_name,
)


def test_rfc2253_order_keywords_escaping_and_hex() -> None:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example, Inc."),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, " eng+ops "),
            x509.NameAttribute(NameOID.COMMON_NAME, 'alice=#1;<x>\\"'),
            x509.NameAttribute(NameOID.EMAIL_ADDRESS, "alice@example.com"),
        ]
    )
    assert rfc2253_name(name) == (
        "1.2.840.113549.1.9.1=#1611616c696365406578616d706c652e636f6d,"
        'CN=alice\\=\\#1\\;\\<x\\>\\\\\\",'
        "OU=\\ eng\\+ops\\ ,"
        "O=Example\\, Inc.,"
        "C=US"
    )


def test_rfc2253_multivalued_rdn_and_dc_uid() -> None:
    name = x509.Name(
        [
            x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "com")]),
            x509.RelativeDistinguishedName(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, "svc"),
                    x509.NameAttribute(NameOID.USER_ID, "42"),
                ]
            ),
        ]
    )
    assert rfc2253_name(name) in ("CN=svc+UID=42,DC=com", "UID=42+CN=svc,DC=com")


def test_a_known_keyword_with_a_non_string_value_is_hex() -> None:
    # Java prints a value that is not a DER string type in #hex form even for a known keyword;
    # NumericString is not one of Java's string types for this purpose.
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "123", _ASN1Type.NumericString)])
    assert rfc2253_name(name) == "CN=#1203313233"


RULES = ", ".join(
    [
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]
)


def test_kafkas_mapper_examples() -> None:
    mapper = SslPrincipalMapper(RULES)
    assert mapper.map("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.map("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.map("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.map("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert (
        mapper.map("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"
    )


def test_comma_with_whitespace_and_escapes() -> None:
    mapper = SslPrincipalMapper("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.map("CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"


@pytest.mark.parametrize(
    "rules",
    [
        "default",
        "DEFAUL",
        "DEFAULT/L",
        "DEFAULT/U",
        "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
        "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
        "RULE:^\\p{Lu}$/$0/",
    ],
)
def test_invalid_rules(rules: str) -> None:
    with pytest.raises(PrincipalMappingError):
        parse_rules(rules)


@pytest.mark.parametrize(
    ("rules", "count"),
    [
        ("", 0),
        ("DEFAULT", 1),
        ("RULE://", 1),
        ("  RULE:// ,  DEFAULT  ", 2),
        (",   , , ,      , , ,   ", 0),
        (",,RULE://,,,DEFAULT,,", 2),
        ("RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/", 2),
    ],
)
def test_rule_splitting(rules: str, count: int) -> None:
    assert len(parse_rules(rules)) == count


def test_java_replacement_semantics() -> None:
    # replaceAll: `.*` also matches the empty string at the end, so the replacement appears twice
    assert SslPrincipalMapper("RULE:.*/X/").map("abc") == "XX"
    # a group that does not exist stays literal; `\$` is a literal dollar; named groups
    assert SslPrincipalMapper("RULE:^CN=(\\w+)$/$1-$2-\\$1/").map("CN=bob") == "bob-$2-$1"
    assert SslPrincipalMapper("RULE:^CN=(?<user>\\w+)$/${user}/U").map("CN=bob") == "BOB"
    with pytest.raises(NoMatchingRuleError):
        SslPrincipalMapper("RULE:^CN=x$/y/").map("CN=z")
    with pytest.raises(NoMatchingRuleError):
        SslPrincipalMapper("").map("CN=z")


def test_no_certificate_is_anonymous() -> None:
    assert principal_from_certificate(None, SslPrincipalMapper()) == ANONYMOUS
