"""aiocop 1.x import path: `from aiocop.core.cpu_sampler import ...` (aliases of the 2.x names)."""

from aiocop._api import is_cpu_sampling_started, start_cpu_sampling

__all__ = ["is_cpu_sampling_started", "start_cpu_sampling"]
