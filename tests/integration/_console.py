"""Helpers of the console's integration tests (tests/integration/test_console_*.py)."""

from __future__ import annotations

import re
from typing import Any

from starlette.testclient import TestClient


def confirmed(client: TestClient, slug: str, form: dict[str, str]) -> Any:
    """Post an action's form, then confirm it with the token of the confirmation page, as a
    browser does; the final answer."""
    review = client.post(f"/actions/{slug}", data=form)
    assert review.status_code == 200, review.text[-2000:]
    token = re.search(r'name="token" value="([^"]+)"', review.text)
    assert token is not None, review.text[-2000:]
    return client.post(
        f"/actions/{slug}", data={**form, "confirmed": "yes", "token": token.group(1)}
    )
