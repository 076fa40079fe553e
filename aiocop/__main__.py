"""`python -m aiocop`: see `aiocop._cli`."""

import sys

from aiocop._cli import main

if __name__ == "__main__":
    sys.exit(main())
