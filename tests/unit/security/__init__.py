"""Unit tests of odradek.security: pure logic, no sockets except the TLS loopback handshake."""
