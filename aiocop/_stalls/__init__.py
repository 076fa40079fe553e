"""The stall watchdog: a background thread that notices loops that have not come back.

- `watchdog`: the thread, its timing of each loop's steps, its stack samples of a stuck one.
- `discovery`: loops aiocop was not told about, found stepping from a thread's stack.
- `tripwire`: a profile function on an idle loop's thread that wakes the watchdog as the loop wakes.
- `probe`: how late each loop runs its timers (the delay histogram).
- `culprit`: naming what a stalled loop was doing, from a sample.

May import: aiocop._common, aiocop._model, aiocop._interception.
"""
