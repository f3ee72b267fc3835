"""ControlledShutdown version 3: request and response."""

from .request import ControlledShutdownRequest
from .response import ControlledShutdownResponse

__all__ = ("ControlledShutdownRequest", "ControlledShutdownResponse")
