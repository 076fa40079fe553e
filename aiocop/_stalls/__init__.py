"""The stall watchdog: a background thread that notices loops that have not come back.

- `watchdog`: the thread: when it looks, what each look does with each loop, when it sleeps and ends.
- `state`: what the watchdog notes of each loop (`LoopState`, held by the loop's `LoopWatch`).
- `settings`: how often it looks and samples (`sampling`, set by `detect_slow_tasks()`).
- `timing`: when a step began and ended, from the looks and the loop thread's CPU clock.
- `stacks`: which step a loop thread's stack is in, and the samples taken of it.
- `attribution`: a finished stall, its task and what the loop was doing.
- `discovery`: loops aiocop was not told about, found stepping from a thread's stack.
- `tripwire`: wakes the watchdog as an idle loop wakes (its selector's select on 3.12+, a profile function before).
- `probe`: how late each loop runs its timers (the delay histogram).
- `culprit`: naming what a stalled loop was doing, from a sample.
- `sink`: the watchdog's part of the seam (`_interception.sink`): where stalls and hangs go.

May import: aiocop._common, aiocop._model, aiocop._interception.
"""
