"""Arguments for the pytest runs the tests start with `pytester`.

The dev environment installs packages whose pytest plugins every run loads:
faker's (pulled in by litestar, for the framework examples) and hypothesis's
add about 1.5 s to each start on CI machines, and none of them has anything
to do with what these runs test. (pytester clears PYTEST_ADDOPTS, so the
arguments are passed explicitly.)
"""

QUIET = ("-p", "no:cacheprovider", "-p", "no:faker", "-p", "no:hypothesispytest")
