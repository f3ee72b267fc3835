"""SCRAM-SHA-256 / SCRAM-SHA-512 exchanges (RFC 5802, RFC 7677), server and client, sans-I/O.

The exchange, two round trips:

    client-first  = gs2-header client-first-bare
    gs2-header    = "n,," | "y,," | "n,a=<authzid>,"      (no channel binding: no "p=")
    client-first-bare = "n=" saslname ",r=" c-nonce ["," extensions]
    server-first  = "r=" c-nonce s-nonce ",s=" base64(salt) ",i=" iterations
    client-final  = "c=" base64(gs2-header) ",r=" c-nonce s-nonce ["," extensions] ",p=" base64(proof)
    server-final  = "v=" base64(ServerSignature)

    AuthMessage     = client-first-bare "," server-first "," client-final-without-proof
    ClientSignature = HMAC(StoredKey, AuthMessage)
    ClientProof     = ClientKey XOR ClientSignature      (the server checks H(proof XOR sig) == StoredKey)
    ServerSignature = HMAC(ServerKey, AuthMessage)

`saslname` escapes `,` as `=2C` and `=` as `=3D`; any other `=` is invalid. A non-empty authzid must
equal the user name (Kafka). The reserved `m=` extension is refused. Kafka's `tokenauth=true`
extension (delegation tokens) is refused: Odradek has no delegation tokens; other extensions are
ignored, as Kafka ignores them.

Failures raise `AuthenticationError` with a fixed client-facing text that does not reveal whether
the user exists. An unknown user is not refused at the first message: the server answers with a
salt derived from the name and a per-process secret, and refuses at the proof, exactly as for a
wrong password, so neither the answer nor its timing tells user names apart (RFC 5802 §9).
Comparisons of secrets use `hmac.compare_digest`. A stored credential with fewer than 4096
iterations is refused (Kafka's minimum).
"""

from __future__ import annotations

import base64
import binascii
import enum
import hmac
import re
import secrets
from collections.abc import Callable

from odradek.security.errors import AuthenticationError
from odradek.security.scram import ScramCredential, ScramMechanism

CredentialLookup = Callable[[str], ScramCredential | None]

_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"  # printable ASCII except ','
_CLIENT_FIRST = re.compile(
    r"(?P<gs2>(?P<cbflag>[ny]),(?:a=(?P<authzid>[^,]*))?,)"
    r"(?P<bare>(?P<reserved>m=[^,]*,)?n=(?P<saslname>[^,]+),r=(?P<nonce>" + _PRINTABLE + r")"
    r"(?P<extensions>(?:,[A-Za-z]+=[^,]*)*))",
    re.DOTALL,
)
_CLIENT_FINAL = re.compile(
    r"(?P<without_proof>c=(?P<channel>[A-Za-z0-9+/=]*),r=(?P<nonce>" + _PRINTABLE + r")"
    r"(?:,[A-Za-z]+=[^,]*)*),p=(?P<proof>[A-Za-z0-9+/=]+)",
    re.DOTALL,
)
_SERVER_FIRST = re.compile(
    r"(?:m=[^,]*,)?r=(?P<nonce>"
    + _PRINTABLE
    + r"),s=(?P<salt>[A-Za-z0-9+/=]+),i=(?P<iterations>[0-9]+)"
    r"(?:,[A-Za-z]+=[^,]*)*"
)
_SERVER_FINAL = re.compile(
    r"(?:e=(?P<error>[^,]*)|v=(?P<signature>[A-Za-z0-9+/=]+))(?:,.*)?", re.DOTALL
)

INVALID_CREDENTIALS = "Authentication failed: Invalid user credentials"
TOKEN_AUTH = "tokenauth"


def sasl_name(username: str) -> str:
    """Escape a user name for `n=` (RFC 5802 §5.1)."""
    return username.replace("=", "=3D").replace(",", "=2C")


def username_from_sasl_name(name: str) -> str:
    """Unescape `n=`; AuthenticationError if an `=` is not part of `=2C` or `=3D`."""
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise AuthenticationError(INVALID_CREDENTIALS, log_detail=f"invalid saslname {name!r}")
    return name.replace("=2C", ",").replace("=3D", "=")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise AuthenticationError(INVALID_CREDENTIALS, log_detail=f"bad base64 in {what}") from None


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def new_nonce() -> str:
    """A printable random nonce (base64url of 24 random bytes: no ',' ever)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(24)).decode().rstrip("=")


class ScramServerState(enum.Enum):
    RECEIVE_CLIENT_FIRST_MESSAGE = "receive client-first"
    RECEIVE_CLIENT_FINAL_MESSAGE = "receive client-final"
    COMPLETE = "complete"
    FAILED = "failed"


# Per-process secret for the fake credentials of unknown users: stable within a process (a client
# probing twice gets the same salt), unknowable outside it.
_DECOY_SECRET = secrets.token_bytes(32)


def _decoy_credential(mechanism: ScramMechanism, username: str) -> ScramCredential:
    digest = mechanism.hmac(_DECOY_SECRET, username.encode("utf-8"))
    return ScramCredential(digest[:32], secrets.token_bytes(len(digest)), digest, 4096)


class ScramServer:
    """One server-side exchange. `evaluate(token)` takes each client message and returns the reply;
    `complete` once the proof verified; then `authorization_id` is the user name.

    The state changes only in `evaluate`; any error moves it to FAILED for good."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        credentials: CredentialLookup,
        nonce_factory: Callable[[], str] = new_nonce,
    ) -> None:
        self.mechanism = mechanism
        self._credentials = credentials
        self._nonce_factory = nonce_factory
        self.state = ScramServerState.RECEIVE_CLIENT_FIRST_MESSAGE
        self.username = ""
        self._credential: ScramCredential | None = None
        self._known_user = False
        self._client_first_bare = ""
        self._gs2_header = ""
        self._server_first = ""
        self._nonce = ""

    @property
    def mechanism_name(self) -> str:
        return self.mechanism.mechanism_name

    @property
    def complete(self) -> bool:
        return self.state is ScramServerState.COMPLETE

    @property
    def authorization_id(self) -> str:
        if not self.complete:
            raise AuthenticationError("Authentication exchange has not completed")
        return self.username

    def evaluate(self, token: bytes) -> bytes:
        try:
            if self.state is ScramServerState.RECEIVE_CLIENT_FIRST_MESSAGE:
                reply = self._client_first(token)
                self.state = ScramServerState.RECEIVE_CLIENT_FINAL_MESSAGE
                return reply
            if self.state is ScramServerState.RECEIVE_CLIENT_FINAL_MESSAGE:
                reply = self._client_final(token)
                self.state = ScramServerState.COMPLETE
                return reply
            raise AuthenticationError(
                "Authentication failed: unexpected SCRAM message",
                log_detail=f"SCRAM message in state {self.state.name}",
            )
        except AuthenticationError:
            self.state = ScramServerState.FAILED
            self._credential = None
            raise

    def _client_first(self, token: bytes) -> bytes:
        text = _decode(token, "client-first")
        match = _CLIENT_FIRST.fullmatch(text)
        if match is None:
            raise AuthenticationError(
                "Authentication failed: Invalid SCRAM client first message format",
                log_detail=f"malformed client-first {text[:100]!r}",
            )
        if match["reserved"]:
            raise AuthenticationError(
                "Authentication failed: unsupported SCRAM extension m=",
                log_detail="client-first with reserved m= extension",
            )
        extensions = dict(item.split("=", 1) for item in match["extensions"].split(",") if item)
        if extensions.get(TOKEN_AUTH, "").lower() == "true":
            raise AuthenticationError(
                "Authentication failed: delegation token authentication is not supported",
                log_detail="tokenauth=true",
            )
        self.username = username_from_sasl_name(match["saslname"])
        authzid = match["authzid"]
        if authzid and username_from_sasl_name(authzid) != self.username:
            raise AuthenticationError(
                "Authentication failed: Client requested an authorization id that is different "
                "from username"
            )
        credential = self._credentials(self.username)
        self._known_user = credential is not None
        if credential is None:
            credential = _decoy_credential(self.mechanism, self.username)
        elif credential.iterations < self.mechanism.min_iterations:
            raise AuthenticationError(
                INVALID_CREDENTIALS,
                log_detail=(
                    f"Iterations {credential.iterations} is less than the minimum "
                    f"{self.mechanism.min_iterations} for {self.mechanism.mechanism_name}"
                ),
            )
        self._credential = credential
        self._gs2_header = match["gs2"]
        self._client_first_bare = match["bare"]
        self._nonce = match["nonce"] + self._nonce_factory()
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        return self._server_first.encode()

    def _client_final(self, token: bytes) -> bytes:
        text = _decode(token, "client-final")
        match = _CLIENT_FINAL.fullmatch(text)
        if match is None:
            raise AuthenticationError(
                "Authentication failed: Invalid SCRAM client final message format",
                log_detail=f"malformed client-final {text[:100]!r}",
            )
        credential = self._credential
        if credential is None:
            raise AuthenticationError(INVALID_CREDENTIALS, log_detail="no credential")
        channel = _b64decode(match["channel"], "channel binding")
        if not hmac.compare_digest(channel, self._gs2_header.encode()):
            raise AuthenticationError(INVALID_CREDENTIALS, log_detail="channel binding mismatch")
        # The nonce must end with the one we sent, as Kafka 3.x checks (`endsWith`): librdkafka
        # up to 2.0 (Debian's kcat) sends its client nonce again in front of the combined one.
        # The proof is computed over the message as sent, which contains our fresh nonce, so a
        # prefix neither replays nor forges anything.
        if not match["nonce"].endswith(self._nonce):
            raise AuthenticationError(INVALID_CREDENTIALS, log_detail="nonce mismatch")
        auth_message = (
            f"{self._client_first_bare},{self._server_first},{match['without_proof']}"
        ).encode()
        proof = _b64decode(match["proof"], "proof")
        signature = self.mechanism.hmac(credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthenticationError(INVALID_CREDENTIALS, log_detail="proof of the wrong length")
        computed_stored_key = self.mechanism.hash(_xor(proof, signature))
        verified = hmac.compare_digest(computed_stored_key, credential.stored_key)
        if not (verified and self._known_user):
            detail = "wrong password" if self._known_user else f"unknown user {self.username!r}"
            raise AuthenticationError(INVALID_CREDENTIALS, log_detail=detail)
        server_signature = self.mechanism.hmac(credential.server_key, auth_message)
        self._credential = None
        return b"v=" + base64.b64encode(server_signature)


def _decode(token: bytes, what: str) -> str:
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationError(
            f"Authentication failed: Invalid SCRAM {what} message format",
            log_detail=f"{what} is not UTF-8",
        ) from None


class ScramClient:
    """The client side (the broker as an inter-broker client; tests). `first_message()`, then
    `final_message(server_first)`, then `verify_server_final(server_final)`, which raises
    AuthenticationError unless the server proved it knows the credential."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        username: str,
        password: str,
        nonce: str | None = None,
    ) -> None:
        self.mechanism = mechanism
        self.username = username
        self._password = password
        self._client_nonce = nonce or new_nonce()
        self._client_first_bare = f"n={sasl_name(username)},r={self._client_nonce}"
        self._auth_message = b""
        self._salted_password = b""

    def first_message(self) -> bytes:
        return f"n,,{self._client_first_bare}".encode()

    def final_message(self, server_first: bytes) -> bytes:
        text = _decode(server_first, "server-first")
        match = _SERVER_FIRST.fullmatch(text)
        if match is None or not match["nonce"].startswith(self._client_nonce):
            raise AuthenticationError(
                "Invalid SCRAM server first message", log_detail=f"server-first {text[:100]!r}"
            )
        iterations = int(match["iterations"])
        if iterations < self.mechanism.min_iterations:
            raise AuthenticationError(f"Server asked for only {iterations} iterations")
        salt = _b64decode(match["salt"], "salt")
        self._salted_password = self.mechanism.salted_password(self._password, salt, iterations)
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={match['nonce']}"
        self._auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        client_key = self.mechanism.client_key(self._salted_password)
        signature = self.mechanism.hmac(self.mechanism.hash(client_key), self._auth_message)
        proof = base64.b64encode(_xor(client_key, signature)).decode()
        return f"{without_proof},p={proof}".encode()

    def verify_server_final(self, server_final: bytes) -> None:
        text = _decode(server_final, "server-final")
        match = _SERVER_FINAL.fullmatch(text)
        if match is None:
            raise AuthenticationError("Invalid SCRAM server final message")
        if match["error"] is not None:
            raise AuthenticationError(f"SCRAM server error: {match['error']}")
        expected = self.mechanism.hmac(
            self.mechanism.server_key(self._salted_password), self._auth_message
        )
        if not hmac.compare_digest(_b64decode(match["signature"], "signature"), expected):
            raise AuthenticationError("Invalid server signature in SCRAM server final message")
