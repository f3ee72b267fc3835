"""ZooKeeper ACLs on the znodes brokers create (`zookeeper.set.acl=true`), as Kafka sets them.

With `zookeeper.set.acl=true` a Kafka broker authenticates to ZooKeeper and creates every znode
with an ACL that lets only its own identity change it (ALL for the creator) and everyone read it
— except the sensitive trees, which nobody else may even read: SCRAM credentials
(`/config/users`), broker configs that may hold passwords (`/config/brokers`) and delegation
tokens (`/delegation_token`) (Kafka's `ZkData.defaultAcls` and `sensitiveRootPaths`).

Kafka authenticates with SASL (a JAAS `Client` section, DigestLoginModule or Kerberos), which
needs a matching JAAS configuration on every ZooKeeper server. Odradek uses ZooKeeper's built-in
`digest` scheme with the same user name and password (`addauth digest user:password`), which every
ZooKeeper server accepts without configuration; the ACL identity is therefore
`digest:<user>:<base64 SHA-1 of user:password>` rather than `sasl:<user>`. Every broker of a cluster
must use the same credentials, so that each may change what another created (the controller
rewrites partition states a leader created, and so on).

Immutable; any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.security import ACL, make_acl, make_digest_acl

SENSITIVE_ROOT_PATHS = ("/config/users", "/config/brokers", "/delegation_token")


def is_sensitive(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in SENSITIVE_ROOT_PATHS)


@dataclass(frozen=True, slots=True)
class ZkCredentials:
    """The broker's ZooKeeper identity for the `digest` scheme."""

    username: str
    password: str

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """kazoo's `auth_data`: sent with `addauth` on every (re)connection."""
        return [("digest", f"{self.username}:{self.password}")]

    def acls(self, path: str) -> list[ACL]:
        """The ACL of a znode this broker creates at `path`."""
        creator = make_digest_acl(self.username, self.password, all=True)
        if is_sensitive(path):
            return [creator]
        return [creator, make_acl("world", "anyone", read=True)]

    @property
    def default_acl(self) -> list[ACL]:
        """For parents kazoo creates on the way (`makepath`): readable by everyone."""
        return self.acls("/")
