"""Authorization of requests: the one question handlers ask, asked in one place.

`RequestAuthorizer` wraps the broker's `AclAuthorizer` (`authorizer.class.name` set) or allows
everything (no authorizer, Kafka's default). Handlers ask it exactly the questions
`odradek.security.api_acls` lists for their API, before doing anything, and answer a refusal with
the AUTHORIZATION_FAILED code of the resource type (`error_for`), changing nothing:

    if not broker.authorizer.allowed(context, READ, TOPIC, name): ...TOPIC_AUTHORIZATION_FAILED

* `allowed` — one resource; a refusal of something the client named is logged by the authorizer's
  audit logger at INFO;
* `cluster` — the one Cluster resource;
* `filter` — the subset of names allowed, for requests that silently leave out what the principal
  may not see (Metadata of all topics, ListGroups), refusals logged at DEBUG;
* `any_of_type` — KIP-679's "on some resource of this type".

The principal of a request is the text its connection authenticated as (`User:alice`), parsed
once per distinct value.

Concurrency: event loop thread only (the ACL cache is updated on that thread too).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from odradek.network.request_context import RequestContext
from odradek.security.acl import (
    CLUSTER,
    AclOperation,
    Resource,
    ResourceType,
    authorization_error,
)
from odradek.security.authorizer import AclAuthorizer
from odradek.security.principal import KafkaPrincipal

READ = AclOperation.READ
WRITE = AclOperation.WRITE
CREATE = AclOperation.CREATE
DELETE = AclOperation.DELETE
ALTER = AclOperation.ALTER
DESCRIBE = AclOperation.DESCRIBE
CLUSTER_ACTION = AclOperation.CLUSTER_ACTION
DESCRIBE_CONFIGS = AclOperation.DESCRIBE_CONFIGS
ALTER_CONFIGS = AclOperation.ALTER_CONFIGS
IDEMPOTENT_WRITE = AclOperation.IDEMPOTENT_WRITE

TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
TRANSACTIONAL_ID = ResourceType.TRANSACTIONAL_ID


@functools.lru_cache(maxsize=4096)
def _principal(text: str) -> KafkaPrincipal:
    return KafkaPrincipal.parse(text)


def error_for(resource_type: ResourceType) -> ErrorCode:
    """TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED, ..."""
    return authorization_error(resource_type)


TOPIC_AUTHORIZATION_FAILED = error_for(TOPIC)
GROUP_AUTHORIZATION_FAILED = error_for(GROUP)
CLUSTER_AUTHORIZATION_FAILED = error_for(ResourceType.CLUSTER)


class RequestAuthorizer:
    """The broker's answer to "may this request's principal do this?" (module docstring)."""

    def __init__(self, authorizer: AclAuthorizer | None = None) -> None:
        self.authorizer = authorizer

    @property
    def enabled(self) -> bool:
        return self.authorizer is not None

    @property
    def acl_version(self) -> int:
        """Changes whenever an ACL changes (memoised answers include it in their key)."""
        return self.authorizer.cache.version if self.authorizer is not None else 0

    def is_super_user(self, context: RequestContext) -> bool:
        return self.authorizer is None or self.authorizer.is_super_user(
            _principal(context.principal)
        )

    def allowed(
        self,
        context: RequestContext,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        *,
        log_if_denied: bool = True,
    ) -> bool:
        authorizer = self.authorizer
        if authorizer is None:
            return True
        return authorizer.authorize(
            _principal(context.principal),
            context.client_host,
            operation,
            Resource(resource_type, name),
            log_if_denied=log_if_denied,
        )

    def cluster(
        self, context: RequestContext, operation: AclOperation, *, log_if_denied: bool = True
    ) -> bool:
        authorizer = self.authorizer
        if authorizer is None:
            return True
        return authorizer.authorize(
            _principal(context.principal),
            context.client_host,
            operation,
            CLUSTER,
            log_if_denied=log_if_denied,
        )

    def filter(
        self,
        context: RequestContext,
        operation: AclOperation,
        resource_type: ResourceType,
        names: Iterable[str],
    ) -> set[str]:
        names = set(names)
        if self.authorizer is None or self.is_super_user(context):
            return names
        return {
            name
            for name in names
            if self.allowed(context, operation, resource_type, name, log_if_denied=False)
        }

    def any_of_type(
        self, context: RequestContext, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        authorizer = self.authorizer
        if authorizer is None:
            return True
        return authorizer.authorize_by_resource_type(
            _principal(context.principal), context.client_host, operation, resource_type
        )


ALLOW_ALL = RequestAuthorizer()
