"""Security: authentication (TLS, SASL PLAIN/SCRAM), principals, authorization with Kafka's
AclAuthorizer semantics, and the checks that keep forged controller requests out (issue 14).

Layering (DESIGN.md §9): this package imports only `odradek.protocol`, `odradek.zk`,
`odradek.errors`, the standard library and third-party libraries (`cryptography`). Everything here
is sans-I/O or reaches ZooKeeper through a narrow Protocol (`acl_store.AclZk`, which `ZkClient` and
the tests' in-memory fake both satisfy), so the network layer and the request handlers wire it in
without this package knowing about them.

Principals and TLS
* `principal` — KafkaPrincipal (`User:alice`), ANONYMOUS, `super.users`.
* `principal_mapping` — a certificate's DN as Java prints it, `ssl.principal.mapping.rules`,
  `principal_from_certificate`.
* `ssl_config` — `listener_ssl_config` (listener-prefixed `ssl.*`), `server_context`,
  `client_context` from Kafka's `ssl.*` properties.
* `certificates` — a local CA, broker and client certificates (`create_local_pki`).

SASL
* `jaas` — Kafka's JAAS syntax (`sasl.jaas.config`, JAAS files).
* `sasl_plain`, `sasl_scram`, `scram` — the mechanisms, sans-I/O, and Kafka's credential formats.
* `credential_store` — SCRAM credentials from `/config/users`, following `/config/changes`.
* `sasl_config` — a listener's mechanisms and limits from broker properties.
* `authenticator` — the per-connection SASL state machine (handshake, authenticate, KIP-368).

Authorization
* `acl` — resource types, patterns, operations, bindings, filters, AUTHORIZATION_FAILED codes.
* `authorizer` — `AclAuthorizer.authorize(principal, host, operation, resource)` over `AclCache`.
* `acl_store` — ACLs in ZooKeeper: load, change notifications, CreateAcls/DeleteAcls.
* `api_acls` — which operation on which resource each API needs.
* `znodes`, `notifications` — the security znodes and change-notification bookkeeping.

Inter-broker trust
* `controller_requests` — ControllerEpochValidator and the pure checks for LeaderAndIsr,
  StopReplica, UpdateMetadata, ControlledShutdown and follower fetches.
"""
