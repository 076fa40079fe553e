"""Setting attributes on C types whose classes refuse `setattr`.

`threading.Lock` and `select.poll` objects are instances of immutable C
types. Their methods can still be replaced through the type's own dict; the
interpreter is then told the type changed so that its method caches are
dropped (what forbiddenfruit does, with the stdlib only).
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any


def _type_dict(tp: type) -> dict[str, Any]:
    referents = gc.get_referents(tp.__dict__)
    if len(referents) != 1 or not isinstance(referents[0], dict):
        raise TypeError(f"cannot reach the dict of {tp!r}")
    return referents[0]


def set_type_attr(tp: type, name: str, value: Any) -> None:
    try:
        setattr(tp, name, value)
        return
    except TypeError:
        pass
    _type_dict(tp)[name] = value
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(tp))


def del_type_attr(tp: type, name: str) -> None:
    try:
        delattr(tp, name)
        return
    except TypeError:
        pass
    _type_dict(tp).pop(name, None)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(tp))
