"""The principal of a TLS client certificate: its subject DN as Java prints it, rewritten by
`ssl.principal.mapping.rules` (Kafka's `SslPrincipalMapper`, KIP-371).

The DN is the string of Java's `X500Principal.getName()` (RFC 2253), because operators' ACLs and
mapping rules were written against it:

* RDNs from the last in the certificate to the first (`CN=alice,OU=eng,O=Example,C=US`),
  multi-valued RDNs joined with `+`;
* the keywords of RFC 2253 only: CN, C, L, ST, O, OU, STREET, DC, UID; any other attribute is
  written as its dotted OID with the value as `#` and the lower-case hex of its DER encoding
  (`1.2.840.113549.1.9.1=#16...` for an e-mail address), as is a value that is not a string;
* in string values, `, = + < > # ; " \\` are escaped with a backslash, as are leading and trailing
  spaces, and NUL is written `\\00`.

Mapping rules: `DEFAULT` or `RULE:pattern/replacement/[LU]`, comma-separated (`/` and `\\` escaped
with `\\` inside pattern and replacement), tried in order; the first rule whose pattern matches the
whole DN wins; DEFAULT yields the DN unchanged; no match is an error (the connection is refused).
The pattern is a Java regex: Python's `re` accepts the common subset; named groups `(?<n>...)` are
translated, and constructs Python lacks (`\\p{...}`, `\\Q...\\E`) are refused when the rules are
parsed. The replacement uses Java's syntax: `$1` (greedy, as Java: `$12` is group 12 if it exists),
`${name}`, `\\x` for a literal x; a group number above the pattern's groups stays literal (Kafka's
escapeLiteralBackReferences). As in Kafka, the replacement is applied with `replaceAll`, so a
pattern that can also match the empty string at the end (`.*`) appends the replacement twice. `/L`
lower-cases and `/U` upper-cases the result (English rules).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.oid import NameOID

from odradek.security.errors import NoMatchingRuleError, PrincipalMappingError
from odradek.security.principal import ANONYMOUS, KafkaPrincipal

_RFC2253_KEYWORDS = {
    NameOID.COMMON_NAME: "CN",
    NameOID.COUNTRY_NAME: "C",
    NameOID.LOCALITY_NAME: "L",
    NameOID.STATE_OR_PROVINCE_NAME: "ST",
    NameOID.ORGANIZATION_NAME: "O",
    NameOID.ORGANIZATIONAL_UNIT_NAME: "OU",
    NameOID.STREET_ADDRESS: "STREET",
    NameOID.DOMAIN_COMPONENT: "DC",
    NameOID.USER_ID: "UID",
}

# ASN.1 universal tags of string types, and how their contents are encoded.
_UTF8, _PRINTABLE, _T61, _IA5, _GENERAL, _BMP, _UNIVERSAL = 12, 19, 20, 22, 27, 30, 28
_STRING_TAGS = frozenset({_UTF8, _PRINTABLE, _T61, _IA5, _GENERAL, _BMP})  # Java's isDerString
_ESCAPED = frozenset(',=+<>#;"\\')


def _der_length(length: int) -> bytes:
    if length < 0x80:
        return bytes([length])
    encoded = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(encoded)]) + encoded


def _der_value(attribute: x509.NameAttribute) -> bytes:
    # cryptography keeps the ASN.1 type of each attribute (private attribute `_type`, an enum
    # whose value is the universal tag); the DER of the value is needed for Java's `#hex` form.
    tag = int(getattr(getattr(attribute, "_type", None), "value", _UTF8))
    value = attribute.value
    if isinstance(value, bytes):  # BIT STRING (x500UniqueIdentifier): no unused bits
        content = b"\x00" + value
    elif tag == _BMP:
        content = value.encode("utf-16-be")
    elif tag == _UNIVERSAL:
        content = value.encode("utf-32-be")
    elif tag == _UTF8:
        content = value.encode("utf-8")
    else:
        content = value.encode("latin-1", errors="replace")
    return bytes([tag]) + _der_length(len(content)) + content


def _escape(value: str) -> str:
    out = []
    for c in value:
        if c in _ESCAPED:
            out.append("\\" + c)
        elif c == "\0":
            out.append("\\00")
        else:
            out.append(c)
    text = "".join(out)
    lead = len(text) - len(text.lstrip(" \r"))
    trail = len(text) - len(text.rstrip(" \r"))
    if lead == len(text):
        return "".join("\\" + c for c in text)
    middle = text[lead : len(text) - trail]
    return (
        "".join("\\" + c for c in text[:lead])
        + middle
        + "".join("\\" + c for c in text[len(text) - trail :])
    )


def _attribute(attribute: x509.NameAttribute) -> str:
    keyword = _RFC2253_KEYWORDS.get(attribute.oid)
    tag = int(getattr(getattr(attribute, "_type", None), "value", _UTF8))
    if keyword is None or isinstance(attribute.value, bytes) or tag not in _STRING_TAGS:
        name = keyword or attribute.oid.dotted_string
        return f"{name}=#{_der_value(attribute).hex()}"
    return f"{keyword}={_escape(str(attribute.value))}"


def rfc2253_name(name: x509.Name) -> str:
    """Java's `X500Principal.getName()` for a certificate name."""
    return ",".join(
        "+".join(_attribute(attribute) for attribute in rdn) for rdn in reversed(name.rdns)
    )


def certificate_dn(der: bytes) -> str:
    """The subject DN of a DER certificate (`SSLObject.getpeercert(binary_form=True)`)."""
    return rfc2253_name(x509.load_der_x509_certificate(der).subject)


# -- mapping rules -------------------------------------------------------------------------------

_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE)
_UNSUPPORTED_JAVA = re.compile(r"\\[pP]\{|\\Q|\\E|\\G|\\Z(?![a-z])")
_JAVA_NAMED_GROUP = re.compile(r"\(\?<(?=[A-Za-z])")


def _java_regex(pattern: str) -> re.Pattern[str]:
    if _UNSUPPORTED_JAVA.search(pattern):
        raise PrincipalMappingError(
            f"Invalid rule pattern {pattern!r}: \\p{{..}}, \\Q..\\E, \\G and \\Z are not supported"
        )
    try:
        return re.compile(_JAVA_NAMED_GROUP.sub("(?P<", pattern))
    except re.error as e:
        raise PrincipalMappingError(f"Invalid rule pattern {pattern!r}: {e}") from None


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    to_lower: bool = False
    to_upper: bool = False

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        result = self.pattern.sub(lambda m: _java_replacement(self.replacement, m), dn)
        if self.to_lower:
            return result.lower()
        if self.to_upper:
            return result.upper()
        return result


def _java_replacement(replacement: str, match: re.Match[str]) -> str:
    """Java's Matcher.appendReplacement, with Kafka's literal handling of missing groups."""
    out: list[str] = []
    groups = match.re.groups
    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        if c == "\\" and i + 1 < n:
            out.append(replacement[i + 1])
            i += 2
        elif c == "$" and i + 1 < n and replacement[i + 1] == "{":
            end = replacement.find("}", i + 2)
            if end < 0:
                raise NoMatchingRuleError("named capturing group is missing trailing '}'")
            name = replacement[i + 2 : end]
            try:
                out.append(match.group(name) or "")
            except IndexError:
                raise NoMatchingRuleError(f"No group with name {{{name}}}") from None
            i = end + 1
        elif c == "$" and i + 1 < n and replacement[i + 1].isdigit():
            first = int(replacement[i + 1])
            if first > groups:
                out.append("$")  # Kafka escapes a reference to a group that does not exist
                i += 1
                continue
            number, j = first, i + 2
            while (
                j < n and replacement[j].isdigit() and number * 10 + int(replacement[j]) <= groups
            ):
                number = number * 10 + int(replacement[j])
                j += 1
            out.append(match.group(number) or "")
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_rules(rules: str | None) -> list[Rule]:
    """Parse `ssl.principal.mapping.rules` (None or empty: DEFAULT)."""
    text = (rules if rules is not None else "DEFAULT").strip()
    parsed: list[Rule] = []
    for match in _RULE_SPLITTER.finditer(text):
        rule_text = match.group(1)
        rule = _RULE_PARSER.match(rule_text)
        if rule is None:
            raise PrincipalMappingError(f"Invalid rule: {rule_text}")
        if rule.end() != len(rule_text):
            raise PrincipalMappingError(
                f"Invalid rule: `{rule_text}`, unmatched substring: `{rule_text[rule.end() :]}`"
            )
        if rule.group(1) is not None:
            parsed.append(Rule(None))
        elif rule.group(2) is not None:
            flags = rule.group(6)
            parsed.append(
                Rule(_java_regex(rule.group(2)), rule.group(4), flags == "L", flags == "U")
            )
        # an empty rule (the `(.*?)` branch) is ignored, as in Kafka
        if match.end() == len(text):
            break
    return parsed


class SslPrincipalMapper:
    """`map(dn)` → the principal name; NoMatchingRuleError when no rule applies."""

    def __init__(self, rules: str | None = None) -> None:
        self.rules = parse_rules(rules)

    @classmethod
    def from_rules(cls, rules: Iterable[Rule]) -> SslPrincipalMapper:
        mapper = cls()
        mapper.rules = list(rules)
        return mapper

    def map(self, dn: str) -> str:
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise NoMatchingRuleError(f"No rules apply to {dn}")


def principal_from_certificate(der: bytes | None, mapper: SslPrincipalMapper) -> KafkaPrincipal:
    """The principal of a TLS connection (Kafka's DefaultKafkaPrincipalBuilder for SSL): the
    mapped DN of the client certificate, or `User:ANONYMOUS` when the client sent none
    (`ssl.client.auth=none|requested`). Pass `ssl_object.getpeercert(binary_form=True)`."""
    if not der:
        return ANONYMOUS
    return KafkaPrincipal.user(mapper.map(certificate_dn(der)))
