"""aiocop 1.x import path: `from aiocop.exceptions import ...` (an alias of the 2.x name)."""

from aiocop._model.exceptions import HighSeverityBlockingIoException

__all__ = ["HighSeverityBlockingIoException"]
