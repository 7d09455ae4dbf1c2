"""The TNT_* environment contract in one table.

The runner sets these variables for every rank; users may set them too. The C
core reads the ones it needs itself (core/src/params.c); this table is what the
Python side validates, what `tntrun` maps its flags to, and what docs/ lists.
"""
import os
from dataclasses import dataclass

from tarantella.common.errors import InvalidArgumentError


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "int", "float", "bool", "str", "choice"
    default: object
    doc: str
    choices: tuple = ()


PARAMS = (
    Param("TNT_RANK", "int", None, "rank of this process, 0 <= rank < TNT_SIZE"),
    Param("TNT_SIZE", "int", None, "number of ranks in the job"),
    Param("TNT_LOCAL_RANK", "int", None, "rank among the ranks of this host"),
    Param("TNT_LOCAL_SIZE", "int", None, "number of ranks on this host"),
    Param("TNT_JOB_ID", "str", None, "per-job random id that names the job's shared-memory objects"),
    Param("TNT_FUSION_THRESHOLD_KB", "int", 1024,
          "allreduces of one dtype are packed into one buffer up to this size; 0 disables fusion"),
    Param("TNT_TIMEOUT_S", "float", 300.0,
          "bound on any wait for a peer: a stalled negotiation or silent peer fails after it"),
    Param("TNT_TRANSPORT", "choice", "auto", "transport between ranks", ("auto", "shm", "mpi", "gpi2")),
    Param("TNT_SHM_SLOT_KB", "int", 256, "shared-memory transport: size of one pipelined piece"),
    Param("TNT_SHM_SLOTS", "int", 8, "shared-memory transport: pieces in flight per ring link"),
    Param("TNT_CACHE_CAPACITY", "int", 1024, "negotiated tensor names remembered (steady state costs one bit each)"),
    Param("TNT_SPIN_US", "float", 50.0,
          "microseconds a waiter spins before it sleeps; only when there are two cores per local rank"),
    Param("TNT_TIMELINE", "str", None, "write a Chrome-trace JSON of each rank's collectives to this path"),
    Param("TNT_LOG_LEVEL", "choice", "WARNING", "log level of Tarantella's Python and C logs",
          ("DEBUG", "INFO", "WARNING", "ERROR")),
    Param("TNT_LOG_ON_ALL_DEVICES", "bool", False, "log on every rank, not only the master rank"),
    Param("TNT_OUTPUT_ON_ALL_DEVICES", "bool", False, "show the output of every rank (set by tntrun)"),
    Param("TNT_TENSORBOARD_ON_ALL_DEVICES", "bool", False, "TensorBoard callbacks write on every rank"),
    Param("TNT_ERROR_FILE", "str", None,
          "where an uncaught Python exception of this rank is written as JSON (set by tntrun)"),
)
BY_NAME = {p.name: p for p in PARAMS}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def get(name, environ=None):
    """The value of a TNT_* variable, parsed, or its default. Bad values raise
    InvalidArgumentError naming the variable and what it accepts."""
    param = BY_NAME[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None:
        return param.default
    try:
        if param.kind == "int":
            return int(raw)
        if param.kind == "float":
            return float(raw)
        if param.kind == "bool":
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if param.kind == "choice":
            value = raw.strip().upper() if name == "TNT_LOG_LEVEL" else raw.strip().lower()
            if value not in param.choices:
                raise ValueError
            return value
        return raw
    except ValueError:
        accepted = {"int": "an integer", "float": "a number", "bool": "true or false",
                    "choice": " | ".join(param.choices)}[param.kind]
        raise InvalidArgumentError(
            f"environment variable {name} must be {accepted} ({param.doc}). Received: {name}={raw!r}"
        ) from None


def markdown_table():
    """The docs table of variables, generated from PARAMS."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for p in PARAMS:
        default = "" if p.default is None else f"`{p.default}`"
        rows.append(f"| `{p.name}` | {default} | {p.doc} |")
    return "\n".join(rows)
