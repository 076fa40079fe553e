"""What aiocop reports, and the switches and registries every part reads.

- `events`: the public event types (`SlowTaskEvent`, `BlockingEventInfo`, ...), field-compatible with 1.x.
- `severity`: the weights and the score -> level mapping.
- `exceptions`: what `raise_on_violations` raises inside the offending task.
- `state`: the global switches and per-scope context variables.
- `callbacks`: registered slow-task callbacks and context providers.

May import: aiocop._common.
"""
