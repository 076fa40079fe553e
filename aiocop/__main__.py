"""`python -m aiocop`: see `aiocop._commands.cli`.

The program given to `run` runs right here, at this module's top level: the
CLI's steps before and after it are a generator (`_cli.session`), suspended
meanwhile, so no function of aiocop's is on the stack under the program. A
script's code is run by `exec` (a C call, no frame); a module by runpy, as
`python -m` runs it. What the program sees under it is then this one frame
and the two of runpy that `python -m aiocop` itself runs in.
"""

import runpy
import sys

from aiocop._commands import cli as _cli

if __name__ == "__main__":
    _steps = _cli.session()
    try:
        _program = next(_steps)
    except StopIteration as _done:
        sys.exit(_done.value)
    try:
        _globals = _cli.prepare(_program)
        if _program.module is not None:
            # What `python -m` itself calls: the module's own globals and runpy's two frames under it.
            runpy._run_module_as_main(_program.module)  # type: ignore[attr-defined]
        else:
            exec(_cli.script_code(_program), _globals)
    except BaseException as _error:  # the program's own end: shown as Python would, then the summary
        _status = _cli.program_failed(_error)
    else:
        _status = 0
    try:
        _steps.send(_status)
    except StopIteration as _done:
        sys.exit(_done.value)
