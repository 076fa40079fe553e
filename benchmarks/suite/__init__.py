"""The benchmark suite behind `benchmarks/run_benchmark.py`.

Orchestration only: every measurement runs in a child process from
`benchmarks/children/`, so that the baseline is a process that never
imported aiocop.
"""
