"""The project's error types, in one leaf module (it imports nothing of the project).

Services, topology, scenarios and analysis raise these; only the command line turns them into
one line on stderr and an exit status. Anything that subclasses ``UserError`` is something the
user can fix: bad input, a missing package, a port in use.
"""
from __future__ import annotations


class UserError(Exception):
    """An error the user can fix; the command line prints it as one line and exits 2."""


class ConfigError(UserError, ValueError):
    """A configuration (a file, a flag, a value) that cannot run; the message says what to fix."""


class EnvironmentProblem(UserError):
    """The machine cannot run this: not root, a missing Debian package, no netem in the kernel."""
