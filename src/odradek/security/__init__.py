"""Security: authentication (TLS, SASL PLAIN/SCRAM), principals, and authorization with Kafka's
AclAuthorizer semantics, plus the checks that keep forged controller requests out.

Layering (DESIGN.md §9): this package imports only `odradek.protocol`, `odradek.zk`,
`odradek.errors`, the standard library and third-party libraries. Everything here is sans-I/O or
talks to ZooKeeper through a narrow Protocol, so the network layer and the request handlers wire it
in without this package knowing about them.

Modules:

* `principal` — KafkaPrincipal, ANONYMOUS, `super.users`.
* `acl` — resource types, pattern types, operations, permissions, bindings, filters, error codes.
* `authorizer` — AclCache and AclAuthorizer: `authorize(principal, host, operation, resource)`.
* `acl_store` — loads ACLs from ZooKeeper, follows change notifications, CreateAcls/DeleteAcls.
* `znodes` — the security znodes (ACL stores and notifications, `/config/users/<user>`).
* `notifications` — sequential change notification bookkeeping shared by ACLs and users.
"""
