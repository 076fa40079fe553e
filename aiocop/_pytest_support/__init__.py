"""The pytest plugin's private helpers (the plugin itself is `aiocop.pytest_plugin`).

- `settings`: its flags, ini keys and markers, read and checked once.
- `events`: which events belong to which test phase, and which fail it.

May import: aiocop._common, aiocop._model, aiocop._interception, aiocop._stalls, aiocop._reporting,
aiocop._configuration, aiocop._api.
"""
