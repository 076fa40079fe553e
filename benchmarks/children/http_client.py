"""The fallback HTTP load generator, for machines without wrk.

    python http_client.py PORT CONNECTIONS WARMUP DURATION [PATH]

HTTP/1.1 keep-alive GETs over CONNECTIONS connections, each waiting for its
reply before sending the next (as wrk does); prints one JSON line in the
format of `wrk_report.lua`. It is Python: on a fast server it runs out of
CPU before wrk does, and the docs say which one measured what.
"""

from __future__ import annotations

import sys

from _load import ClosedLoopClient, Window, drive, new_loop, report


class HttpClient(ClosedLoopClient):
    def __init__(self, request: bytes, window: Window) -> None:
        super().__init__(request, window)
        self.buffer = bytearray()
        self.body_left = -1  # -1: still reading the head

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while True:
            if self.body_left < 0:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buffer[:end]).lower()
                if not head.startswith((b"http/1.1 200", b"http/1.0 200")):
                    self.window.errors += 1
                at = head.find(b"content-length:")
                self.body_left = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
                del buffer[: end + 4]
            if len(buffer) < self.body_left:
                return
            del buffer[: self.body_left]
            self.body_left = -1
            self.reply_complete()
            if not buffer:
                return


def main() -> None:
    port, connections = int(sys.argv[1]), int(sys.argv[2])
    warmup, duration = float(sys.argv[3]), float(sys.argv[4])
    path = sys.argv[5] if len(sys.argv) > 5 else "/"
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    window = Window(warmup, duration)
    loop = new_loop()
    try:
        loop.run_until_complete(drive(lambda w: HttpClient(request, w), port, connections, window))
    finally:
        loop.close()
    print(report(window, duration, connections=connections, generator="python"))


if __name__ == "__main__":
    main()
