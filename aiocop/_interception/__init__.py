"""Call interception: every detected blocking call passes through here, on the thread that made it.

- `hook`: the audit hook, the hot path (one dict miss for an event aiocop does not care about).
- `wrappers`: thin wrappers raising events for stdlib calls that have none (`standin`, `typepatch`,
  `reload` keep them invisible to the program).
- `rules`: what counts as a blocking call and how much it weighs (data).
- `internals`, `harmless`: known loop machinery and known-harmless internals (data, and their matcher).
- `allow`, `scope`: the user's allow rules, global and scoped.
- `frames`: classifying and formatting the frames of a captured stack.
- `loops`: which threads run an event loop now, and each loop's watch: the hook records each call on
  its loop's watch, and the watchdog reads them.
- `trio_runs`: trio's run loop (not asyncio): which trio task runs a step on this thread, and the
  instrument that delivers the step's calls when it ends.

- `sink`: the seam: the record of callables through which the hook and the loops' tracking hand on what
  they find (a batch of steps to deliver, a loop that stopped, ...), installed from above by `_api`.

The wrappers reach the hook through the hook function `wrappers` keeps, handed over by `hook.install()`.

May import: aiocop._common, aiocop._model.
"""
