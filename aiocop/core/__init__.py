"""aiocop 1.x import paths (`aiocop.core.*`), kept so that 1.x code runs unchanged.

Each module here only re-exports the 2.x names that 1.x exported from it;
new code imports from `aiocop` itself. See docs/migration.md.
"""
