"""Kafka-protocol admin clients over the project's own connections (`odradek.network.client`):
the command-line tools (`odradek topics`, `acls`, `transactions`, ...) and the console's ACL and
transactions pages share them. Nothing here prints or parses command lines."""
