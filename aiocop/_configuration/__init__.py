"""One configuration for every entry point: `[tool.aiocop]`, and baselines of known call sites.

- `config`: reading and checking `[tool.aiocop]`.
- `baseline`: the call sites that block today, recorded so that later runs fail only on new ones.

May import: aiocop._common, aiocop._model, aiocop._interception, aiocop._stalls, aiocop._reporting.
"""
