"""The security package's exceptions.

Two families, as in `odradek.errors`:

* configuration mistakes an operator can fix (a bad `ssl.*` property, a JAAS line that does not
  parse, a principal mapping rule that is not a rule) are `ConfigError`s: the command line prints
  them as one line;
* errors a client must see carry Kafka's error code: a failed SASL exchange is
  SASL_AUTHENTICATION_FAILED, an unknown mechanism UNSUPPORTED_SASL_MECHANISM, a request out of
  place during authentication ILLEGAL_SASL_STATE, a refused operation the AUTHORIZATION_FAILED code
  of its resource type (see `odradek.security.acl.authorization_error`).

The message of an `AuthenticationError` is sent to the client (SaslAuthenticate's error_message), so
it must never say whether a user exists: mechanisms raise it with fixed texts and keep the detail for
the broker's log in `log_detail`.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from odradek.errors import ConfigError, KafkaError


class SecurityConfigError(ConfigError):
    """An invalid security property (`ssl.*`, `sasl.*`, `super.users`, JAAS, mapping rules)."""


class JaasConfigError(SecurityConfigError):
    """A JAAS configuration (a `sasl.jaas.config` value or a JAAS file) that does not parse."""


class SslConfigError(SecurityConfigError):
    """`ssl.*` properties that cannot make an SSL context (missing keystore, wrong password, a
    keystore type or cipher suite this implementation does not support, ...)."""


class PrincipalMappingError(SecurityConfigError):
    """An `ssl.principal.mapping.rules` value that is not a list of rules."""


class NoMatchingRuleError(KafkaError):
    """No principal mapping rule applies to a certificate's DN (Kafka's NoMatchingRule): the TLS
    connection is refused, as Kafka refuses it."""

    code = ErrorCode.sasl_authentication_failed


class AuthenticationError(KafkaError):
    """A SASL exchange failed: wrong password, unknown user, malformed token, expired session.

    `str(error)` goes to the client; `log_detail` (never sent) says what really went wrong."""

    code = ErrorCode.sasl_authentication_failed

    def __init__(self, message: str, *, log_detail: str = "") -> None:
        super().__init__(message)
        self.log_detail = log_detail or message


class UnsupportedSaslMechanismError(KafkaError):
    code = ErrorCode.unsupported_sasl_mechanism


class IllegalSaslStateError(KafkaError):
    """A request that is not allowed in the connection's authentication state."""

    code = ErrorCode.illegal_sasl_state


class InvalidScramCredentialError(SecurityConfigError):
    """A SCRAM credential string (`salt=..,stored_key=..,server_key=..,iterations=..`) or a
    `kafka-configs.sh --add-config 'SCRAM-SHA-256=[...]'` value that is not valid."""


class InvalidAclError(KafkaError):
    """An ACL binding that cannot be stored: unknown type or operation, a resource name with '/',
    an operation the resource type does not support. Kafka answers CreateAcls with INVALID_REQUEST."""

    code = ErrorCode.invalid_request


class AclUpdateConflictError(KafkaError):
    """The compare-and-set loop on an ACL znode lost the race too many times in a row (Kafka's
    "Failed to update ACLs ... after trying a maximum of 10 times")."""

    code = ErrorCode.unknown_server_error
