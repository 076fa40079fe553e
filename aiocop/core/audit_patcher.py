"""aiocop 1.x import path: `from aiocop.core.audit_patcher import ...` (aliases of the 2.x names)."""

from aiocop._interception.rules import get_blocking_events_dict
from aiocop._interception.wrappers import PATCH_TARGETS, get_patched_functions, patch_audit_functions

# The callables aiocop wraps, by the name 1.x used, with the weight of the
# event each raises (as they stand when this module is imported).
FUNCTIONS_TO_PATCH_DICT: dict[str, int] = {
    target.name: get_blocking_events_dict().get(target.event, 0) for target in PATCH_TARGETS
}
FUNCTIONS_TO_PATCH: list[str] = list(FUNCTIONS_TO_PATCH_DICT)

__all__ = ["FUNCTIONS_TO_PATCH", "FUNCTIONS_TO_PATCH_DICT", "get_patched_functions", "patch_audit_functions"]
