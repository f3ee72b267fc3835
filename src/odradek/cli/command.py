"""How an admin tool that prints lines ends (`topics`, `acls`, `configs`), as Kafka's shell tools do:
the lines on stdout and exit status 0, or, for a mistake in the arguments or a refusal from the
cluster (`OperatorError`), one `odradek: error: ...` line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from odradek.errors import OperatorError

Command = TypeVar("Command")


def print_command_lines(
    args: argparse.Namespace,
    validate: Callable[[argparse.Namespace], Command],
    run: Callable[[Command], Coroutine[Any, Any, list[str]]],
) -> int:
    """Validate `args` into a command, run it, print its lines; the exit status."""
    try:
        lines = asyncio.run(run(validate(args)))
    except OperatorError as e:
        print(f"odradek: error: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0
