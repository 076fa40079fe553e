"""`python -m aiocop attach PID`: both sides of an attach, one module each.

- `command`: the attaching side: the command's steps, from the PID to the printed report.
- `files`: its hold on the target (the pinned process, the exchange folder, the code sent), checked as hostile.
- `proc`: what the OS says a thread of the target waits on, read from outside.
- `report`: what the target writes back, checked field by field before use.
- `agent`: what runs inside the target (sent there as source, with the rest of aiocop but `cli`).
"""
