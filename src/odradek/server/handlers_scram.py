"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), KIP-554; and the SASL APIs
(SaslHandshake 17, SaslAuthenticate 36) when they reach the request handlers.

SCRAM credentials live in `/config/users/<user>` (`odradek.security.credential_store`); a change is
announced under `/config/changes`, so every broker's SCRAM server sees it within moments.

* Describe needs DESCRIBE on the cluster: the mechanisms and iteration counts of the named users
  (all users with credentials when none are named); an unknown user gets RESOURCE_NOT_FOUND, a
  user named twice DUPLICATE_RESOURCE. Salts and keys never leave the broker.
* Alter needs ALTER on the cluster. An upsertion carries the salt and the salted password
  (Hi(password, salt, iterations), computed by the client: the password never travels); the broker
  derives the stored and server keys. Per user, as Kafka answers: UNSUPPORTED_SASL_MECHANISM for an
  unknown mechanism, UNACCEPTABLE_CREDENTIAL for an empty name, salt or salted password or for
  iterations outside 4096..16384, DUPLICATE_RESOURCE for a user whose mechanism is both deleted and
  upserted (or twice), RESOURCE_NOT_FOUND for deleting a credential that does not exist.

SaslHandshake and SaslAuthenticate are answered by the connection's authenticator on SASL listeners;
one that reaches a handler came over a listener without SASL (or after authentication), and gets
ILLEGAL_SASL_STATE, as Kafka's request handlers answer it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.protocol.build import build_response
from odradek.security.scram import ScramCredential, ScramMechanism
from odradek.server.authorization import ALTER, CLUSTER_AUTHORIZATION_FAILED, DESCRIBE

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

log = logging.getLogger(__name__)

_MECHANISMS = {m.code: m for m in ScramMechanism}


def _mechanism(code: int) -> ScramMechanism | None:
    return _MECHANISMS.get(int(code))


def handle_describe_user_scram_credentials(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    if not broker.authorizer.cluster(context, DESCRIBE):
        return build_response(
            header,
            {"error_code": CLUSTER_AUTHORIZATION_FAILED, "error_message": "Authorization failed."},
        )
    store = broker.credential_store

    async def describe(user: str) -> dict[str, Any]:
        # Read from ZooKeeper, as Kafka does: a client sees its own AlterUserScramCredentials at
        # once, whichever broker it asks.
        credentials = await store.read_credentials(user)
        infos = [
            {"mechanism": mechanism.code, "iterations": credentials[mechanism].iterations}
            for mechanism in ScramMechanism
            if mechanism in credentials
        ]
        if not infos:
            return {
                "user": user,
                "error_code": ErrorCode.resource_not_found,
                "error_message": f"Attempt to describe a user credential that does not exist: {user}",
                "credential_infos": (),
            }
        return {
            "user": user,
            "error_code": ErrorCode.none,
            "error_message": None,
            "credential_infos": infos,
        }

    async def answer() -> Any:
        if not request.users:
            results = [await describe(u) for u in await store.users_with_credentials()]
        else:
            names = [u.name for u in request.users]
            results = []
            for name in dict.fromkeys(names):
                if names.count(name) > 1:
                    results.append(
                        {
                            "user": name,
                            "error_code": ErrorCode.duplicate_resource,
                            "error_message": f"Cannot describe SCRAM credentials for the same "
                            f"user twice in a single request: {name}",
                            "credential_infos": (),
                        }
                    )
                else:
                    results.append(await describe(name))
        return build_response(
            header, {"error_code": ErrorCode.none, "error_message": None, "results": results}
        )

    return answer()


def _credential(mechanism: ScramMechanism, salt: bytes, salted_password: bytes, iterations: int):
    client_key = mechanism.client_key(salted_password)
    return ScramCredential(
        salt, mechanism.hash(client_key), mechanism.server_key(salted_password), iterations
    )


def handle_alter_user_scram_credentials(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    users = list(
        dict.fromkeys([d.name for d in request.deletions] + [u.name for u in request.upsertions])
    )
    if not broker.authorizer.cluster(context, ALTER):
        return build_response(
            header,
            {
                "results": [
                    {
                        "user": user,
                        "error_code": CLUSTER_AUTHORIZATION_FAILED,
                        "error_message": "Authorization failed.",
                    }
                    for user in users
                ]
            },
        )
    store = broker.credential_store
    errors: dict[str, tuple[ErrorCode, str]] = {}
    seen: dict[str, set[int]] = {}

    def fail(user: str, code: ErrorCode, message: str) -> None:
        errors.setdefault(user, (code, message))

    for item in list(request.deletions) + list(request.upsertions):
        mechanisms = seen.setdefault(item.name, set())
        if int(item.mechanism) in mechanisms:
            fail(
                item.name,
                ErrorCode.duplicate_resource,
                "A user credential cannot be altered twice in the same request",
            )
        mechanisms.add(int(item.mechanism))
        if not item.name:
            fail(item.name, ErrorCode.unacceptable_credential, "Username must not be empty")
        mechanism = _mechanism(item.mechanism)
        if mechanism is None:
            fail(item.name, ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
    for item in request.upsertions:
        mechanism = _mechanism(item.mechanism)
        if mechanism is None:
            continue
        if item.iterations < mechanism.min_iterations:
            fail(item.name, ErrorCode.unacceptable_credential, "Too few iterations")
        elif item.iterations > mechanism.max_iterations:
            fail(item.name, ErrorCode.unacceptable_credential, "Too many iterations")
        elif not item.salt or not item.salted_password:
            fail(item.name, ErrorCode.unacceptable_credential, "Empty salt or salted password")

    async def alter() -> Any:
        # Deleting a credential that does not exist is refused; ZooKeeper says what exists (as
        # in Kafka), not this broker's cache, which may not have heard of a moment-old write yet.
        for item in request.deletions:
            mechanism = _mechanism(item.mechanism)
            if (
                mechanism is not None
                and item.name not in errors
                and mechanism not in await store.read_credentials(item.name)
            ):
                fail(
                    item.name,
                    ErrorCode.resource_not_found,
                    "Attempt to delete a user credential that does not exist",
                )
        results = []
        for user in users:
            if user in errors:
                code, message = errors[user]
                results.append({"user": user, "error_code": code, "error_message": message})
                continue
            upserts = {}
            for item in request.upsertions:
                mechanism = _mechanism(item.mechanism)
                if item.name == user and mechanism is not None:
                    upserts[mechanism] = _credential(
                        mechanism, bytes(item.salt), bytes(item.salted_password), item.iterations
                    )
            deletions = tuple(
                m
                for item in request.deletions
                if item.name == user and (m := _mechanism(item.mechanism)) is not None
            )
            try:
                await store.alter_credentials(user, upserts, deletions)
            except Exception as e:
                log.error("altering the SCRAM credentials of %r failed: %s", user, e)
                results.append(
                    {
                        "user": user,
                        "error_code": ErrorCode.unknown_server_error,
                        "error_message": str(e),
                    }
                )
                continue
            log.info("altered the SCRAM credentials of %r", user)
            results.append({"user": user, "error_code": ErrorCode.none, "error_message": None})
        return build_response(header, {"results": results})

    return alter()


def handle_sasl_handshake(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    return build_response(
        context.header, {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": ()}
    )


def handle_sasl_authenticate(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    return build_response(
        context.header,
        {
            "error_code": ErrorCode.illegal_sasl_state,
            "error_message": "SaslAuthenticate request received outside of SASL authentication",
            "auth_bytes": b"",
        },
    )
