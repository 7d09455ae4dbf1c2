"""What each rank executes: the interpreter (if any) followed by the user's command."""
import os
import re
import shlex
import shutil
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


def script_problem(interpreter, command, module=False, cwd=None):
    """Why the Python script command[0] cannot run, or None. Python would start on every rank
    and fail there (`can't open file`, or a binary read as source: `SyntaxError: source code
    cannot contain null bytes`), each rank with its own report; tntrun says it once, at once.
    Only for a script that the rank's Python runs: not for -m, --no-python, an interpreter of
    the user's own (`-- python x.py`, `--python-interpreter "valgrind python"`) or a Python
    option (`-- -c CODE`); a directory with a __main__.py or a zip file is left to Python."""
    interp = interpreter_argv(interpreter)
    if command and is_python(command[0]) and interp and len(command) > 1:
        # `-- python train.py`, as mpirun's users write it: the same checks for its script
        # (before: every rank's "can't open file", exit 2, and a report named "python")
        return script_problem(None, command[1:], module, cwd)
    if module or not command or not interp or not is_python(interp[-1]) or is_python(command[0]):
        return None
    program = command[0]
    if program.startswith("-"):
        return None
    path = os.path.join(cwd or os.getcwd(), program)
    if not os.path.exists(path):
        found = shutil.which(program) if os.sep not in program else None
        if found:
            return (f"cannot start {program!r}: no such file here; {found} is a command of that "
                    f"name: tntrun runs PROGRAM with Python, to run an executable write "
                    f"--no-python (tntrun --no-python -- {program} ...)")
        return f"cannot start {program!r}: no such file ({path})"
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "__main__.py")):
        return f"cannot start {program!r}: it is a directory without a __main__.py, not a Python script"
    if not os.path.isfile(path):
        return None  # a package to run, a pipe (reading it would take the program's input)
    try:
        with open(path, "rb") as f:
            head = f.readline(200)
    except OSError:
        return None  # unreadable: Python says why
    what = ("a compiled executable" if head.startswith(b"\x7fELF") else
            f"a script for {head[2:].decode(errors='replace').strip()}"
            if head.startswith(b"#!") and b"python" not in head else None)
    if what:
        shown = program if os.sep in program else "./" + program  # exec does not search "."
        return (f"cannot start {program!r}: it is {what}, not a Python script: to run it, write "
                f"--no-python (tntrun --no-python -- {shown} ...)")
    return None


def program_name(command, module=False):
    """What the report calls the program: the script or module after an interpreter the user
    wrote (`-- python train.py` is train.py, `-- python -m pkg.train` pkg.train), else
    command[0]. Before, the report read "tntrun: python FAILED"."""
    if not command:
        return ""
    if module or not is_python(command[0]) or len(command) < 2:
        return command[0]
    rest = command[1:]
    if rest[0] == "-m" and len(rest) > 1:
        return rest[1]
    return command[0] if rest[0].startswith("-") else rest[0]
