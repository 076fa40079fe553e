"""Events delivered and shown: from a step's raw records to callbacks, logs, summaries and pictures.

- `delivery`: building each step's `SlowTaskEvent` and handing it to the callbacks.
- `hangs`: hung loops, reported while they hang.
- `report`: events as text and plain data (shared by logs, the CLI and the pytest plugin).
- `logs`: the standard `logging` callback and its per-call-site rate limit.
- `sites`: bounded call-site attribute sets for metrics.
- `timeline`, `exports`, `html_report` (with `html_report.html`, `html_report.js`), `report_files`:
  the run's model and its HTML, speedscope and folded-stack files.

May import: aiocop._common, aiocop._model, aiocop._interception, aiocop._stalls.
"""
