"""LeaderAndIsr version 5: request and response."""

from .request import LeaderAndIsrRequest
from .response import LeaderAndIsrResponse

__all__ = ("LeaderAndIsrRequest", "LeaderAndIsrResponse")
