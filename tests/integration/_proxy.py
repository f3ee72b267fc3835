"""A TCP proxy in front of one broker that can drop a Produce response, for retry tests.

`DroppingProxy` listens on a port, connects each client connection to the broker and copies
Kafka frames both ways on two threads per connection. Once `arm()` is called, the next Produce
request is forwarded to the broker as usual, but when the broker's answer to it arrives the proxy
throws the answer away and closes both sides of that connection: the broker has appended the
batch, the client never hears so and must retry on a new connection -- the situation idempotence
exists for. `produce_requests` counts every Produce request forwarded (the retry included).

Every socket has a timeout and every thread is a daemon that `close()` ends; nothing outlives a test.
"""

from __future__ import annotations

import socket
import struct
import threading

SIZE = struct.Struct(">i")
HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id
PRODUCE = 0
TIMEOUT_S = 60.0


def _read_exactly(sock: socket.socket, count: int) -> bytes | None:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _read_frame(sock: socket.socket) -> bytes | None:
    prefix = _read_exactly(sock, 4)
    if prefix is None:
        return None
    body = _read_exactly(sock, SIZE.unpack(prefix)[0])
    return None if body is None else prefix + body


class DroppingProxy:
    def __init__(self, listen_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target: tuple[str, int] | None = None
        self.produce_requests = 0
        self.dropped = 0
        self._armed = False
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._server = socket.create_server((host, listen_port))
        self._server.settimeout(0.5)
        self.port = int(self._server.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._thread.start()

    def arm(self) -> None:
        """Drop the answer to the next Produce request (and close that connection)."""
        with self._lock:
            self._armed = True

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            if self.target is None:
                client.close()
                continue
            try:
                broker = socket.create_connection(self.target, timeout=TIMEOUT_S)
            except OSError:
                client.close()
                continue
            for sock in (client, broker):
                sock.settimeout(TIMEOUT_S)
            with self._lock:
                self._sockets += [client, broker]
            doomed: set[int] = set()  # correlation ids whose answers are dropped
            threading.Thread(
                target=self._requests, args=(client, broker, doomed), daemon=True
            ).start()
            threading.Thread(
                target=self._responses, args=(broker, client, doomed), daemon=True
            ).start()

    def _requests(self, client: socket.socket, broker: socket.socket, doomed: set[int]) -> None:
        try:
            while (frame := _read_frame(client)) is not None:
                api_key, _version, correlation_id = HEADER.unpack_from(frame, 4)
                if api_key == PRODUCE:
                    with self._lock:
                        self.produce_requests += 1
                        if self._armed:
                            self._armed = False
                            doomed.add(correlation_id)
                broker.sendall(frame)
        except OSError:
            pass
        finally:
            self._shut(client, broker)

    def _responses(self, broker: socket.socket, client: socket.socket, doomed: set[int]) -> None:
        try:
            while (frame := _read_frame(broker)) is not None:
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                if correlation_id in doomed:
                    with self._lock:
                        self.dropped += 1
                    return  # the broker has answered: drop it and cut the client off
                client.sendall(frame)
        except OSError:
            pass
        finally:
            self._shut(client, broker)

    @staticmethod
    def _shut(*sockets: socket.socket) -> None:
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
