"""Where the console's JavaScript comes from: htmx, installed from npm by `./dev setup`.

Nothing third-party is committed to git and nothing is fetched at run time. `./dev setup` runs
`npm ci` in `src/odradek/console/assets` (versions pinned by its package-lock.json), which puts
htmx in `assets/node_modules/htmx.org/dist/` (git-ignored); `ODRADEK_CONSOLE_ASSETS` names another
directory holding `htmx.min.js`. Without it the pages still work as plain HTML (links and forms),
only without live updates, and the console says so at start-up.
"""

from __future__ import annotations

import os
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
HTMX_DIST = ASSETS / "node_modules" / "htmx.org" / "dist"
HTMX_FILE = "htmx.min.js"


def vendor_directory() -> Path | None:
    """The directory holding htmx.min.js, or None when it is not installed."""
    override = os.environ.get("ODRADEK_CONSOLE_ASSETS")
    for candidate in ([Path(override)] if override else []) + [HTMX_DIST]:
        if (candidate / HTMX_FILE).is_file():
            return candidate
    return None
