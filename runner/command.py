"""What each rank executes: the interpreter (if any) followed by the user's command."""
import os
import re
import shlex
import sys

_PYTHON = re.compile(r"^python[0-9.]*$")


def is_python(token):
    """True for an interpreter name such as python, python3, python3.11 or sys.executable."""
    return bool(_PYTHON.match(os.path.basename(token))) or token == sys.executable


def interpreter_argv(interpreter):
    """--python-interpreter as a list: None is the Python that runs tntrun, "" is none
    (PROGRAM is an executable), anything else is split like a shell would
    ("valgrind --leak-check=yes python")."""
    if interpreter is None:
        return [sys.executable]
    return shlex.split(interpreter)


def rank_argv(interpreter, command, module=False):
    """The argv of a rank.

    `command` is what followed `--` (PROGRAM and its arguments). When the user already
    wrote an interpreter (`-- python x.py`), it is not doubled: the interpreter's own
    prefix (e.g. "valgrind --leak-check=yes") is kept and the user's python is used.
    With module=True, command[0] is a module run as `python -m MODULE`.
    """
    interp = interpreter_argv(interpreter)
    if module:
        return interp + ["-m"] + list(command)
    if command and is_python(command[0]) and interp:
        prefix = interp[:-1] if is_python(interp[-1]) else interp
        return prefix + list(command)
    return interp + list(command)
