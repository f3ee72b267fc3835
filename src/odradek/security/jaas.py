"""JAAS configuration, as Kafka reads it: the `sasl.jaas.config` property value
(`listener.name.<l>.<mechanism>.sasl.jaas.config`) and JAAS files (`KafkaServer { ... };`,
`Client { ... };` for ZooKeeper).

A property value is one or more login module entries:

    <loginModuleClass> <controlFlag> (<optionName>=<optionValue>)* ;

for example `org.apache.kafka.common.security.plain.PlainLoginModule required username="admin"
password="admin-secret" user_admin="admin-secret";`. A file wraps entries in named sections:

    KafkaServer { <entry> <entry> ... };

Tokens follow `java.io.StreamTokenizer` as Kafka's `JaasConfig` sets it up, because operators' files
were written against it:

* whitespace is any character up to and including space; `//` comments run to the end of the
  line, `/* ... */` comments nest nothing, and a lone `/` also starts a comment to the end of line;
* a *word* starts with an ASCII letter, `_`, `$`, or a character from U+00A0 up, and continues with
  those, digits, `.` and `-` (so class names and `admin-secret` need no quotes);
* a *quoted string* is delimited by `"` or `'`, may not span lines, and understands the escapes
  `\\n \\t \\r \\b \\f \\a \\v \\\\ \\" \\'` and octal `\\ooo`; any other escaped character stands
  for itself;
* a token starting with a digit, or with `.` or `-` before a digit, is a number: Kafka then has no
  string value and refuses the option ("Value not specified"), so `iterations=4096` must be quoted;
* any other character (`=`, `;`, `{`, `}`) is a token by itself.

The control flag is `required`, `requisite`, `sufficient` or `optional` (case-insensitive). Option
names and values are case-sensitive; a repeated option keeps the last value, as Java's HashMap does.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from odradek.security.errors import JaasConfigError


class ControlFlag(enum.Enum):
    REQUIRED = "required"
    REQUISITE = "requisite"
    SUFFICIENT = "sufficient"
    OPTIONAL = "optional"


@dataclass(frozen=True, slots=True)
class JaasEntry:
    """One login module with its options."""

    login_module: str
    control_flag: ControlFlag
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def module_name(self) -> str:
        """The class name without its package (`PlainLoginModule`)."""
        return self.login_module.rsplit(".", 1)[-1]


PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
ZK_DIGEST_LOGIN_MODULE = "org.apache.zookeeper.server.auth.DigestLoginModule"


class _Kind(enum.Enum):
    WORD = "word"
    QUOTED = "quoted string"
    NUMBER = "number"
    CHAR = "character"
    EOF = "end of input"


@dataclass(frozen=True, slots=True)
class _Token:
    kind: _Kind
    text: str

    @property
    def string_value(self) -> str | None:
        """What StreamTokenizer's `sval` holds: the text of words and quoted strings."""
        return self.text if self.kind in (_Kind.WORD, _Kind.QUOTED) else None


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _is_word_start(c: str) -> bool:
    return (c.isascii() and (c.isalpha() or c in "_$")) or ord(c) >= 0xA0


def _is_word_part(c: str) -> bool:
    return _is_word_start(c) or (c.isascii() and (c.isdigit() or c in ".-"))


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c <= " ":
            i += 1
        elif c == "/":
            if text.startswith("/*", i):
                end = text.find("*/", i + 2)
                if end < 0:
                    raise JaasConfigError("JAAS config has an unterminated /* comment")
                i = end + 2
            else:  # `//` and a lone `/` both comment out the rest of the line
                end = text.find("\n", i)
                i = n if end < 0 else end + 1
        elif c in "\"'":
            i, value = _quoted(text, i)
            tokens.append(_Token(_Kind.QUOTED, value))
        elif (c.isascii() and c.isdigit()) or (c in ".-" and i + 1 < n and text[i + 1].isdigit()):
            start = i
            i += 1
            while i < n and text[i].isascii() and (text[i].isdigit() or text[i] == "."):
                i += 1
            tokens.append(_Token(_Kind.NUMBER, text[start:i]))
        elif _is_word_start(c):
            start = i
            while i < n and _is_word_part(text[i]):
                i += 1
            tokens.append(_Token(_Kind.WORD, text[start:i]))
        else:
            tokens.append(_Token(_Kind.CHAR, c))
            i += 1
    tokens.append(_Token(_Kind.EOF, ""))
    return tokens


def _quoted(text: str, start: int) -> tuple[int, str]:
    quote = text[start]
    out: list[str] = []
    i, n = start + 1, len(text)
    while i < n:
        c = text[i]
        if c == quote:
            return i + 1, "".join(out)
        if c in "\r\n":
            break
        if c == "\\" and i + 1 < n:
            nxt = text[i + 1]
            if nxt in "01234567":
                j = i + 1
                # up to three octal digits, the first at most 3 when three are used (as Java)
                limit = 3 if nxt <= "3" else 2
                while j < n and j - (i + 1) < limit and text[j] in "01234567":
                    j += 1
                out.append(chr(int(text[i + 1 : j], 8)))
                i = j
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    raise JaasConfigError("JAAS config has an unterminated quoted string")


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.position = 0

    def peek(self) -> _Token:
        return self.tokens[self.position]

    def next(self) -> _Token:
        token = self.tokens[self.position]
        if token.kind is not _Kind.EOF:
            self.position += 1
        return token

    def at_char(self, char: str) -> bool:
        token = self.peek()
        return token.kind is _Kind.CHAR and token.text == char

    def entry(self) -> JaasEntry:
        module = self.next().string_value
        if module is None:
            raise JaasConfigError("Login module not specified in JAAS config")
        flag_token = self.next()
        if flag_token.kind is _Kind.EOF:
            raise JaasConfigError("Login module control flag not specified in JAAS config")
        flag_text = (flag_token.string_value or flag_token.text).lower()
        try:
            flag = ControlFlag(flag_text)
        except ValueError:
            raise JaasConfigError(
                f"Invalid login module control flag '{flag_token.text}' in JAAS config"
            ) from None
        options: dict[str, str] = {}
        while not self.at_char(";"):
            key_token = self.next()
            if key_token.kind is _Kind.EOF or self.at_char("}"):
                raise JaasConfigError("JAAS config entry not terminated by semi-colon")
            key = key_token.string_value or key_token.text
            if not self.at_char("="):
                raise JaasConfigError(f"Value not specified for key '{key}' in JAAS config")
            self.next()
            value = self.next().string_value
            if value is None:
                raise JaasConfigError(f"Value not specified for key '{key}' in JAAS config")
            options[key] = value
        self.next()  # the ';'
        return JaasEntry(module, flag, options)


def parse_jaas_config(value: str) -> list[JaasEntry]:
    """Parse a `sasl.jaas.config` property value (one or more entries, no sections)."""
    parser = _Parser(value)
    entries = []
    while parser.peek().kind is not _Kind.EOF:
        entries.append(parser.entry())
    if not entries:
        raise JaasConfigError("Login module not specified in JAAS config")
    return entries


def parse_jaas_file(text: str) -> dict[str, list[JaasEntry]]:
    """Parse a JAAS file: `Name { entries };` sections (ZooKeeper's `Client`, Kafka's
    `KafkaServer`, `<listener>.KafkaServer`) → entries per section name."""
    parser = _Parser(text)
    sections: dict[str, list[JaasEntry]] = {}
    while parser.peek().kind is not _Kind.EOF:
        name = parser.next().string_value
        if name is None or not parser.at_char("{"):
            raise JaasConfigError("JAAS file: expected 'Name {' to open a section")
        parser.next()
        entries = []
        while not parser.at_char("}"):
            if parser.peek().kind is _Kind.EOF:
                raise JaasConfigError(f"JAAS file: section {name!r} is not closed by '}}'")
            entries.append(parser.entry())
        parser.next()
        if parser.at_char(";"):
            parser.next()
        sections[name] = entries
    return sections


def login_module(entries: list[JaasEntry], module: str) -> JaasEntry:
    """The entry of `module` (full class name) in a parsed config; JaasConfigError if absent."""
    for entry in entries:
        if entry.login_module == module:
            return entry
    raise JaasConfigError(f"JAAS config has no {module} entry")


def plain_users(entry: JaasEntry) -> dict[str, str]:
    """The PLAIN server's users: each `user_<name>="<password>"` option (Kafka's
    PlainServerCallbackHandler); `username`/`password` are the broker's own client credentials,
    not a user."""
    return {
        key[len("user_") :]: value
        for key, value in entry.options.items()
        if key.startswith("user_")
    }


def server_jaas_property(
    properties: Mapping[str, str], listener: str, mechanism: str
) -> str | None:
    """A broker's JAAS config for one listener and mechanism:
    `listener.name.<listener>.<mechanism>.sasl.jaas.config`, both lower-cased as Kafka's config
    prefix does. A broker ignores the unprefixed `sasl.jaas.config` (Kafka: "the property name must
    be prefixed with the listener prefix including the SASL mechanism"); without the property Kafka
    falls back to a JAAS file section (`<listener>.KafkaServer`, then `KafkaServer`), which the
    caller reads with `parse_jaas_file`. Clients (and the broker as a client of another broker)
    use the plain `sasl.jaas.config`."""
    return properties.get(f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config")


def zookeeper_credentials(
    sections: Mapping[str, list[JaasEntry]], section: str = "Client"
) -> tuple[str, str] | None:
    """The broker's ZooKeeper user name and password from a JAAS file's `Client` section
    (`org.apache.zookeeper.server.auth.DigestLoginModule required username=".." password="..";`),
    or None without that section. JaasConfigError if the section lacks them."""
    entries = sections.get(section)
    if entries is None:
        return None
    entry = login_module(entries, ZK_DIGEST_LOGIN_MODULE)
    username, password = entry.options.get("username"), entry.options.get("password")
    if not username or password is None:
        raise JaasConfigError(f"JAAS section {section} must set username and password")
    return username, password
