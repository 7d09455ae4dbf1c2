"""The environment every rank gets: tntrun's own environment, then the TNT_* variables its
flags set, then the user's -x exports in the order given (so -x has the last word), and
finally the placement (TNT_RANK, ...) that only tntrun may set.

Ranks on other hosts get the same (forwarded_names): an engine started on this host hands
its own environment to the ranks it starts here, but not to those it starts elsewhere."""
import os
import re


class UsageError(Exception):
    """Bad command-line input: reported with exit code 2, like argparse does."""


def parse_exports(items, environ=None):
    """-x NAME=VALUE (value may contain '=' and spaces) or -x NAME (forward the current
    value, like mpirun). Returns a list of (name, value) in the order given."""
    environ = os.environ if environ is None else environ
    out = []
    for item in items or []:
        name, sep, value = item.partition("=")
        if not name or not (name[0].isalpha() or name[0] == "_") or not all(
                c.isalnum() or c == "_" for c in name):
            raise UsageError(f"-x expects NAME=VALUE with NAME a variable name. Received: -x {item!r}")
        if name == "TNT_JOB_ID" or (name.startswith("TNT_") and name in _PER_RANK):
            # an export would be overridden for the placement (silently), or, for the job id,
            # name shared memory that tntrun cannot find to clean up
            raise UsageError(
                f"-x {name}: tntrun sets {name} itself for every rank (the placement and the job's "
                "identity): leave it out; -n, -H and --hostfile choose the placement")
        if not sep:
            if name not in environ:
                raise UsageError(
                    f"-x {name}: {name} is not set in this environment, so there is nothing to "
                    f"forward; write -x {name}=VALUE")
            value = environ[name]
        out.append((name, value))
    return out


# what a shell would have replaced in a value: $NAME, ${...}, $(...), `...` (a `$$` is taken
# whole and passed over: `pa$$word` holds no $word)
_SHELL_REFERENCE = re.compile(r"\$\$|\$[A-Za-z_][A-Za-z0-9_]*|\$\{[^}]*\}?|\$\(|`")


def unexpanded_references(items):
    """A WARNING for the -x values that hold what a shell would expand (`-x 'OUT=/logs/$GASPI_RANK'`,
    quoted so that the shell that ran tntrun left it): every rank gets such a value as
    written, as under mpirun, horovodrun and srun, which expand nothing either. The original
    tarantella wrote each -x into the shell script that gaspi_run ran on every rank, as
    `export NAME="VALUE"`, and that script expanded it, per rank: a job script of the original
    that named a file per rank so (`$GASPI_RANK`) now had every rank write one file, without
    a word. Only the references are named, never the value (a -x may carry a secret).
    `items`: the -x arguments as given (a bare -x NAME forwards a value that no shell was
    meant to expand). None when no value has one."""
    found = []
    for item in items or []:
        name, sep, value = item.partition("=")
        refs = [m.group(0) for m in _SHELL_REFERENCE.finditer(value) if m.group(0) != "$$"] if sep else []
        if refs:
            found.append((name, refs[0]))
    if not found:
        return None
    what = ", ".join(f"-x {name} ({ref})" for name, ref in found)
    return (f"{what}: tntrun passes -x values to every rank as written, expanding nothing (as "
            "mpirun does; the original tarantella's script expanded them on each rank). For a value "
            "of your shell's, leave it unquoted (-x OUT=$HOME/out); for a value per rank, read "
            "TNT_RANK in your program (the original's $GASPI_RANK)")


def allowed_cpus():
    """The CPUs this process may run on, its CPU affinity (what taskset, cgroup cpusets and
    Slurm allow), which the ranks inherit; None where it cannot be read."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def usable_cores():
    """How many cores this process may run on (allowed_cpus), rather than every core of the
    machine."""
    allowed = allowed_cpus()
    return len(allowed) if allowed else os.cpu_count() or 1


def tnt_settings(args):
    """The TNT_* variables set by flags (only for flags that were given: otherwise what is
    in the environment already, if anything, passes through unchanged)."""
    env = {}
    if args.log_level:
        env["TNT_LOG_LEVEL"] = args.log_level
    if args.log_on_all_devices:
        env["TNT_LOG_ON_ALL_DEVICES"] = "true"
    if args.output_on_all_devices:
        env["TNT_OUTPUT_ON_ALL_DEVICES"] = "true"
    if args.fusion_threshold is not None:
        env["TNT_FUSION_THRESHOLD_KB"] = str(args.fusion_threshold)
    if args.timeout is not None:
        env["TNT_TIMEOUT_S"] = f"{args.timeout:g}"
    if args.transport:
        env["TNT_TRANSPORT"] = args.transport
    if args.timeline:
        env["TNT_TIMELINE"] = os.path.abspath(args.timeline)
    return env


def job_env(args, exports, job_id, base=None):
    """The part of the environment that is the same on every rank, in order."""
    env = dict(os.environ if base is None else base)
    # set in an initialized rank (tarantella.common.core): a job started from one is new
    env.pop("TNT_RANK_PID", None)
    # the folder where the tntrun that started this process notes its ranks' ends: a job
    # started from a rank has a tntrun of its own (local.rank_specs), or none
    env.pop("TNT_LAUNCHER_DIR", None)
    env.pop("TNT_JOIN_NOTES", None)  # the same, across hosts (the rank wrapper's)
    env["PYTHONUNBUFFERED"] = "1"  # the last lines before a crash must reach us
    env.update(tnt_settings(args))
    env["TNT_JOB_ID"] = job_id
    for name, value in exports:
        env[name] = value
    return env


def as_ranks_see_it(args, name):
    """The value of the setting `name` (TNT_OUTPUT_ON_ALL_DEVICES, TNT_LOG_LEVEL) that the
    ranks will read: the environment, then the flag, then -x (job_env's order). tntrun acts
    on it too (whose output to show, a one-line report), so that it never hides what the
    ranks print for a setting given without the flag. A bad value is a UsageError."""
    from tarantella.common import config
    from tarantella.common.errors import InvalidArgumentError

    try:
        return config.get(name, environ=job_env(args, parse_exports(args.exports), ""))
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from None


def exported_names(args, exports):
    """Names an engine must forward to remote ranks (everything tntrun sets)."""
    names = ["PYTHONUNBUFFERED", "TNT_JOB_ID"] + list(tnt_settings(args))
    for name, _ in exports:
        if name not in names:
            names.append(name)
    return names


# Not forwarded to other hosts: what belongs to this shell session or this host, and what
# the engines and the rank wrapper set for each rank themselves.
_SESSION_OR_HOST = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "HOST", "DISPLAY", "TERM",
                              "TERMCAP", "COLUMNS", "LINES", "MAIL", "PS1", "PS2", "PS4",
                              "PROMPT_COMMAND", "TMUX", "TMUX_PANE", "STY", "WINDOW"})
_PER_RANK = frozenset({"TNT_RANK", "TNT_SIZE", "TNT_LOCAL_RANK", "TNT_LOCAL_SIZE",
                       "TNT_ERROR_FILE", "TNT_LAUNCHER_DIR", "TNT_JOIN_NOTES", "TNT_RANK_PID", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"})
_ENGINE_PREFIXES = ("OMPI_", "OPAL_", "ORTE_", "PRTE_", "PMIX_", "PMI_", "HYDRA_", "SLURM_", "GASPI_",
                    "SSH_", "XDG_", "DBUS_")


def forwarded_names(env):
    """Every variable of `env` that ranks on other hosts must see as tntrun's own ranks do,
    sorted. mpirun (Open MPI) gives ranks it starts on its own host its whole environment
    and those it starts through ssh only what -x names, and gaspi_run gives them nothing: a
    variable set only where tntrun runs (TF_*, a script's own options, a TNT_* setting
    given without a flag) would differ from host to host without a word, and the ranks
    would train differently or stop at TNT_TIMEOUT_S waiting for each other. horovodrun and
    srun (--export=ALL) forward the whole environment too; MPICH's Hydra does by default."""
    return sorted(name for name in env
                  if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
                  and name not in _SESSION_OR_HOST and name not in _PER_RANK
                  and not name.startswith(_ENGINE_PREFIXES))
