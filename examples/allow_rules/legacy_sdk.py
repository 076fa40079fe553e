"""A stand-in for a third-party client library that blocks (for examples/allow_rules/main.py)."""

from __future__ import annotations

import time
from pathlib import Path


def read_config() -> str:
    return Path(__file__).read_text(encoding="utf-8")  # a small local file, read once at start-up


def ping() -> None:
    time.sleep(0.001)  # a blocking network round trip, in real life
