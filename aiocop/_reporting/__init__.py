"""Events delivered and shown: from a step's raw records to callbacks, logs, summaries and pictures.

- `delivery`: who delivers each step's event, and when: on the loop after its iteration, or off it.
- `building`: a step's raw records (and the watchdog's stall) made into a `SlowTaskEvent`, lazily.
- `worker`: the delivery thread and its bounded queue (`delivery="thread"`, and stopped loops' leftovers).
- `hangs`: hung loops, reported while they hang.
- `sink`: the process's one sink, what interception and the watchdog hand on (delivery's and hangs'
  functions), which `_api` installs into them as detection starts.
- `report`: events as text and plain data (shared by logs, the CLI and the pytest plugin).
- `logs`: the standard `logging` callback and its per-call-site rate limit.
- `sites`: bounded call-site attribute sets for metrics.
- `timeline`, `exports`, `html_report` (with `html_report.html`, `html_report.js`), `report_files`:
  the run's model and its HTML, speedscope and folded-stack files.

May import: aiocop._common, aiocop._model, aiocop._interception, aiocop._stalls.
"""
