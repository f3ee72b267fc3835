"""`--command-config FILE`: a Kafka client properties file giving a tool's security settings
(`security.protocol`, `ssl.*`, `sasl.mechanism`, `sasl.jaas.config`), as Kafka's tools take it.

The file is read with Java properties rules; settings the project's client does not use are
ignored. See `odradek.security.client_config` for what each property means.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from odradek.errors import OperatorError
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity
from odradek.security.client_config import client_security
from odradek.server.config import parse_properties


def add_command_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        help="client properties (security.protocol, ssl.*, sasl.mechanism, sasl.jaas.config)",
    )


def read_command_config(path: str | None) -> dict[str, str]:
    if not path:
        return {}
    try:
        return parse_properties(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise OperatorError(f"cannot read --command-config {path}: {e.strerror or e}") from None


def load_command_config(path: str | None) -> ClientSecurity:
    """The security of a tool's connections (PLAINTEXT without a file)."""
    if not path:
        return PLAINTEXT_CLIENT
    return client_security(read_command_config(path))
