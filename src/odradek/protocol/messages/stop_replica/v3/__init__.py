"""StopReplica version 3: request and response."""

from .request import StopReplicaRequest
from .response import StopReplicaResponse

__all__ = ("StopReplicaRequest", "StopReplicaResponse")
