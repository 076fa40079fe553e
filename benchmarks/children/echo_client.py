"""1 KB TCP echo load: `python echo_client.py PORT CONNECTIONS WARMUP DURATION [SIZE]`; prints one JSON line."""

from __future__ import annotations

import sys

from _load import ClosedLoopClient, Window, drive, new_loop, report


class EchoClient(ClosedLoopClient):
    def __init__(self, request: bytes, window: Window) -> None:
        super().__init__(request, window)
        self.pending = len(request)

    def data_received(self, data: bytes) -> None:
        self.pending -= len(data)
        if self.pending <= 0:  # the whole message came back
            self.pending = len(self.request)
            self.reply_complete()


def main() -> None:
    port, connections = int(sys.argv[1]), int(sys.argv[2])
    warmup, duration = float(sys.argv[3]), float(sys.argv[4])
    size = int(sys.argv[5]) if len(sys.argv) > 5 else 1024
    message = b"x" * size
    window = Window(warmup, duration)
    loop = new_loop()
    try:
        loop.run_until_complete(drive(lambda w: EchoClient(message, w), port, connections, window))
    finally:
        loop.close()
    print(report(window, duration, connections=connections, message_bytes=size))


if __name__ == "__main__":
    main()
