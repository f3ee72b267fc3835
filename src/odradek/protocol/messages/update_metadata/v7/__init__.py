"""UpdateMetadata version 7: request and response."""

from .request import UpdateMetadataRequest
from .response import UpdateMetadataResponse

__all__ = ("UpdateMetadataRequest", "UpdateMetadataResponse")
