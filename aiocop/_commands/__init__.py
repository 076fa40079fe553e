"""The command line: `python -m aiocop run` and `python -m aiocop attach PID`.

- `cli`: both commands' parsers, `run`'s steps around the program and its summary.
- `attach`: `python -m aiocop attach PID`, a subpackage: the attaching side (`attach.command`), its hold
  on the target and what the target writes back, both checked as hostile (`attach.files`, `attach.report`,
  `attach.proc`), and what runs inside the target (`attach.agent`, sent there as source, with the rest of
  aiocop but `cli`).

May import: aiocop._common, aiocop._model, aiocop._interception, aiocop._stalls, aiocop._reporting,
aiocop._configuration, aiocop._api.
"""
