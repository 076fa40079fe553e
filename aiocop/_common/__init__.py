"""Small tools every part uses: aiocop's own clocks, fork-safe locks, argument checks, untrusted files.

- `clock`: the real clocks, whatever a test freezes or mocks.
- `forksafe`: locks a forked child can use.
- `validate`: the public API's argument checks, each naming what it rejects.
- `escape`: text made safe for a terminal or a log (control characters escaped).
- `inputs`: reading files aiocop did not write (`pyproject.toml`, baselines) as untrusted input.

May import: nothing of aiocop.
"""
