__version__ = "2.0.0.dev0"
__author__ = "aiocop developers"  # as in pyproject.toml; read by 1.x code as aiocop.__author__
