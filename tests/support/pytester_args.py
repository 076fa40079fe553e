"""Arguments for the pytest runs the tests start with `pytester`.

The dev environment installs packages whose pytest plugins every run loads:
faker's (pulled in by litestar, for the framework examples), hypothesis's
and pytest-trio's add about 1.9 s to each start on CI machines, and none of
them has anything to do with what these runs test. anyio's plugin asks, as
it loads, which back ends can be imported, and so imports trio where it is
installed (as in the dev environment): 0.3 to 0.5 s of CPU a start, in the
hundreds of runs the suite starts on each Python. (pytester clears
PYTEST_ADDOPTS, so the arguments are passed explicitly.)
"""

_ALWAYS_OFF = ("-p", "no:cacheprovider", "-p", "no:faker", "-p", "no:hypothesispytest")
QUIET = (*_ALWAYS_OFF, "-p", "no:anyio", "-p", "no:trio")
# For the runs whose tests are anyio's (`@pytest.mark.anyio`).
WITH_ANYIO = (*_ALWAYS_OFF, "-p", "no:trio")
# pytest-trio's plugin imports trio, 0.35 s of each start: only the runs that
# test it load it (with anyio's, which some of their files use too).
QUIET_BUT_TRIO = _ALWAYS_OFF
