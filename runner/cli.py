"""tntrun (alias tarantella): run a Python program data-parallel on many processes.

    tntrun -n 4 -- train.py --epochs 3            4 ranks on this host
    tntrun --hostfile hosts --n-per-node 2 -- train.py

Everything after `--` (or from the first argument that is not an option) is the user's
command, passed on untouched. Usage errors exit with 2, like argparse.
"""
import argparse
import difflib
import os
import platform
import re
import secrets
import shlex
import sys

from tarantella.common import config
from tarantella.common.errors import InvalidArgumentError
from tarantella.common.startup_log import mark
from tarantella.runner import command as cmd
from tarantella.runner import environment, gpus, local
from tarantella.runner.environment import UsageError
from tarantella.runner.supervise import LaunchError

LOG_LEVELS = {"DEBUG": "DEBUG", "TRACE": "DEBUG", "INFO": "INFO", "WARNING": "WARNING",
              "WARN": "WARNING", "ERROR": "ERROR", "FATAL": "ERROR"}

EXAMPLES = """\
examples:
  tntrun -n 4 -- train.py --batch_size=64      4 ranks on this host
  tntrun -- train.py                            one rank per GPU (one CPU rank without GPUs)
  tntrun -n 2 --no-gpu -x TF_CPP_MIN_LOG_LEVEL=2 -- train.py
  tntrun -n 2 --output-on-all-devices -- train.py   show every rank's output, "[rank]" prefixed
  tntrun --hostfile hosts --n-per-node 2 -- train.py  2 ranks on each host (mpirun/gaspi_run/srun)
  tntrun --dry-run -n 2 -- train.py             print each rank's command and environment
  tntrun --cleanup -- train.py                  stop leftovers of a killed job of train.py
  tntrun -n 2 --python-interpreter "" -- ./run.sh   run an executable, not a Python script

docs: docs/cli.md; environment variables (TNT_*): docs/environment.md
"""


def _version():
    try:
        from importlib.metadata import version
        v = version("tarantella")
    except Exception:
        v = "unknown (not installed)"
    return f"Tarantella {v} (tntrun, {os.path.dirname(os.path.abspath(__file__))})"


def _int_at_least(minimum, words):
    """An argparse type: a whole number >= minimum ("must be <words>")."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number. Received: {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {words}. Received: {text}")
        return value
    return parse


_positive_int = _int_at_least(1, "at least 1")
_nonneg_int = _int_at_least(0, "0 or more")


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds. Received: {text!r}")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0. Received: {text}")
    return value


def _log_level(text):
    level = LOG_LEVELS.get(text.upper())
    if level is None:
        raise argparse.ArgumentTypeError(
            f"choose from DEBUG, INFO, WARNING, ERROR (also TRACE, WARN, FATAL). Received: {text!r}")
    return level


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Fills in the core's defaults (<TNT_TIMEOUT_S> in a help text) only when the help is
    shown: they come from the core's table (core/src/params.c), and reading it loads the
    compiled core, which starting a job does not need."""

    def _get_help_string(self, action):
        def default(match):
            value = config.BY_NAME[match[1]].default
            return f"{value:g}" if isinstance(value, float) else str(value)

        return re.sub(r"<(TNT_[A-Z0-9_]+)>", default, super()._get_help_string(action))


class _Parser(argparse.ArgumentParser):
    """An unknown flag's error names the flags it may have meant. Prefixes of a flag are not
    taken for it (allow_abbrev=False: a typo must not become another flag), though the
    original Tarantella's launcher took them: `--fusion-thresh` now says to spell it out."""

    def error(self, message):
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            flags = [f for action in self._actions for f in action.option_strings if f.startswith("--")]
            hints, prefixes = [], False
            for word in message[len(prefix):].split():
                flag = word.split("=", 1)[0]
                if not flag.startswith("--"):
                    continue
                meant = [f for f in flags if f.startswith(flag)]
                prefixes = prefixes or bool(meant)
                meant = meant or difflib.get_close_matches(flag, flags, n=2, cutoff=0.8)
                if meant:
                    hints.append(f"{flag}: did you mean {' or '.join(dict.fromkeys(meant))}?")
            if hints:
                message += ". " + " ".join(hints) + (" Flags are spelled out in full." if prefixes else "")
        super().error(message)


def build_parser(prog="tntrun"):
    p = _Parser(
        prog=prog, usage=f"{prog} [options] -- PROGRAM [ARGS...]",
        description="Run a Python program on many processes with Tarantella (data parallel).",
        epilog=EXAMPLES, formatter_class=_HelpFormatter, allow_abbrev=False)
    p.add_argument("--version", "--check-build", dest="version", action="store_true",
                   help="print the version, the transports available on this machine (and "
                        "why the others are not) and the TensorFlow frontend's state (compiled "
                        "ops, GPUs, CUDA runtime, NCCL), then exit")
    p.add_argument("--dry-run", action="store_true",
                   help="print the command and environment of every rank (or the engine command "
                        "for several hosts) and start nothing")

    single = p.add_argument_group("Single-node execution")
    single.add_argument("-n", "-np", "--np", "--num-proc", "--ntasks", dest="n", type=_positive_int,
                        metavar="N", help="number of ranks on this host (with --hostfile: the total)")
    single.add_argument("--no-gpu", "--no-gpus", dest="no_gpu", action="store_true",
                        help="run on CPUs only and hide the GPUs from the ranks")
    single.add_argument("--ranks-per-gpu", type=_positive_int, default=1, metavar="K",
                        help="put K ranks on each GPU (rank r on GPU r // K), for small models on a "
                             "large GPU or tests on one GPU; GPU tensors then go through host memory "
                             "(NCCL refuses two ranks on one GPU). Default 1")
    single.add_argument("--python-interpreter", metavar="CMD", default=None,
                        help='interpreter that runs PROGRAM (default: the Python running tntrun); '
                             '"" runs PROGRAM as an executable; may have arguments, e.g. '
                             '"valgrind --leak-check=yes python"')
    single.add_argument("--no-python", action="store_true",
                        help='run PROGRAM as an executable (same as --python-interpreter "")')
    single.add_argument("-m", "--module", action="store_true",
                        help="PROGRAM is a module, run as `python -m PROGRAM`")

    multi = p.add_argument_group("Multi-node execution")
    multi.add_argument("--hostfile", "--machinefile", metavar="FILE",
                       help="hosts to run on: one per line, `host`, `host slots=N` or `host:N`")
    multi.add_argument("-H", "--hosts", metavar="H1[:N],H2[:N]",
                       help="hosts to run on, comma separated (instead of --hostfile)")
    multi.add_argument("--n-per-node", "--devices-per-node", "--npernode", "--nproc-per-node",
                       "--nproc_per_node", "-ppn", "--ntasks-per-node", dest="n_per_node", metavar="N",
                       help="ranks on each host (N, or gpu/cpu/auto); without hosts, on this one "
                            "(torchrun --nproc_per_node N)")
    multi.add_argument("--transport", choices=("auto", "shm", "mpi", "gpi2"),
                       help="transport between ranks (TNT_TRANSPORT; default auto: shm on one "
                            "host; across hosts shm within each host and mpi between hosts); gpi2 "
                            "launches through gaspi_run")

    out = p.add_argument_group("Logging and output")
    out.add_argument("--log-level", type=_log_level, metavar="LEVEL",
                     help="DEBUG, INFO, WARNING or ERROR (TNT_LOG_LEVEL; default WARNING)")
    out.add_argument("--verbose", action="store_true", help="same as --log-level INFO")
    out.add_argument("--log-on-all-devices", action="store_true",
                     help="Tarantella logs on every rank, not only the master (TNT_LOG_ON_ALL_DEVICES)")
    out.add_argument("--output-on-all-devices", "-l", "--label", dest="output_on_all_devices",
                     action="store_true",
                     help='show the output of every rank, each line prefixed "[rank]" '
                          "(default: only rank 0's output; a failing rank's errors are always shown)")
    out.add_argument("-x", dest="exports", action="append", metavar="NAME=VALUE",
                     help="export a variable to every rank: one per -x, repeatable, later ones "
                          "win (as mpirun's -x); -x NAME forwards its current value")

    perf = p.add_argument_group("Performance tuning")
    perf.add_argument("--fusion-threshold", type=_nonneg_int, metavar="KB",
                      help="pack allreduces into buffers up to KB kibibytes; 0 disables fusion "
                           "(TNT_FUSION_THRESHOLD_KB; default <TNT_FUSION_THRESHOLD_KB>)")
    perf.add_argument("--fusion-threshold-mb", type=float, metavar="MB",
                      help="the same in MiB (as horovodrun's flag)")
    perf.add_argument("--timeout", type=_positive_float, metavar="S",
                      help="a rank waiting longer than S seconds for a peer fails "
                           "(TNT_TIMEOUT_S; default <TNT_TIMEOUT_S>)")
    perf.add_argument("--timeline", "--timeline-filename", metavar="FILE",
                      help="write a Chrome-trace timeline of the collectives to FILE (TNT_TIMELINE); "
                           "with several ranks one file per rank, e.g. trace.rank0.json")
    perf.add_argument("--pin-to-socket", action="store_true",
                      help="bind each rank's CPUs to one socket (NUMA node), round robin; uses numactl")
    perf.add_argument("--bind-to", "--numa-binding", dest="bind_to", choices=("socket",),
                      help="same as --pin-to-socket (mpirun and torchrun spelling)")
    perf.add_argument("--pin-memory-to-socket", action="store_true",
                      help="also allocate each rank's memory on its socket only (needs numactl)")

    clean = p.add_argument_group("Cleanup")
    clean.add_argument("--cleanup", action="store_true",
                       help="stop the ranks of earlier jobs of PROGRAM that are still running "
                            "(SIGTERM) and remove their shared memory; without PROGRAM: every "
                            "job whose tntrun is gone")
    clean.add_argument("--force", action="store_true", help="with --cleanup: SIGKILL instead of SIGTERM")

    compat = p.add_argument_group("Compatibility")
    compat.add_argument("--max-restarts", type=int, default=0, metavar="0",
                        help="accepted for torchrun users; only 0 (restarts are not supported: "
                             "checkpoint and relaunch)")
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def _refuse_export_list(parser, word):
    """The original command took `-x A=1 B=2`; ours takes one NAME=VALUE per -x (as mpirun
    does), so a stray NAME=VALUE where the program should be is that list: say so."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word, re.DOTALL):
        parser.error(f"{word!r} is not a program: -x takes one NAME=VALUE: write -x {word}")


def parse(argv, prog="tntrun"):
    """(args, command): options before `--`, the user's command after it (or from the
    first positional argument on, as torchrun and horovodrun accept)."""
    parser = build_parser(prog)
    args = None
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        command = argv[cut + 1:]
        if args.command:
            # the command started before this `--` (`tntrun -n 2 train.py --epochs 3 -- x`):
            # the `--` is one of its arguments, as every word after PROGRAM is
            _refuse_export_list(parser, args.command[0])
            args = None
    if args is None:
        args = parser.parse_args(argv)
        command = list(args.command)
        if command and not os.path.exists(command[0]):
            _refuse_export_list(parser, command[0])
    for flag, value, example in (("--hostfile", args.hostfile, '--hostfile "$HOSTFILE"'),
                                 ("-H/--hosts", args.hosts, '-H "$HOSTS"')):
        # an empty value is false: the job ran on this host alone, as if no list were given
        if value is not None and not value.strip():
            parser.error(f"{flag} is empty (an unset variable, as in {example}?): name the hosts, "
                         "or leave the flag out to run on this host")
    if args.force and not args.cleanup:
        parser.error("--force only goes with --cleanup")
    if args.max_restarts != 0:
        parser.error("--max-restarts: restarts are not supported (checkpoint and relaunch). "
                     f"Received: --max-restarts {args.max_restarts}")
    if args.verbose and not args.log_level:
        args.log_level = "INFO"
    if args.fusion_threshold_mb is not None:
        if args.fusion_threshold is not None:
            parser.error("give --fusion-threshold (KB) or --fusion-threshold-mb, not both")
        if args.fusion_threshold_mb < 0:
            parser.error(f"--fusion-threshold-mb must be 0 or more. Received: {args.fusion_threshold_mb}")
        args.fusion_threshold = int(round(args.fusion_threshold_mb * 1024))
    # the core's own bounds (core/src/params.c), checked here so that a bad value
    # stops tntrun instead of failing on every rank after they start
    for flag, name, value in (("--fusion-threshold", "TNT_FUSION_THRESHOLD_KB", args.fusion_threshold),
                              ("--timeout", "TNT_TIMEOUT_S", args.timeout)):
        if value is not None:
            try:
                config.get(name, environ={name: str(value)})
            except InvalidArgumentError as exc:
                parser.error(f"{flag} {value}: {exc}")
    if args.bind_to:
        args.pin_to_socket = True
    if args.no_python:
        if args.python_interpreter not in (None, ""):
            parser.error("--no-python and --python-interpreter contradict each other")
        args.python_interpreter = ""
    if args.module and args.python_interpreter == "":
        # `python -m MODULE` needs a Python: without one the rank would exec "-m"
        parser.error("-m/--module runs PROGRAM as `python -m PROGRAM`, so it needs a Python "
                     "interpreter: leave out --no-python / --python-interpreter \"\"")
    args.prog = prog  # `tarantella` (the original's name) refuses what it read otherwise
    return parser, args, command


def _other_hosts(args):
    """The hosts of --hostfile / -H other than this one (none when neither is given)."""
    if not (args.hostfile or args.hosts):
        return []
    import socket

    from tarantella.runner import hostfile
    hosts = hostfile.of_args(args)
    node = platform.node()
    here = {node, node.split(".")[0], socket.getfqdn(), "localhost", "127.0.0.1"}
    return [h for h, _ in hosts if h not in here and h.split(".")[0] not in here]


def _warn(message):
    print(f"tntrun: WARNING: {message}", file=sys.stderr, flush=True)


def _local_plan(args, command, job_id, private_dir):
    """(specs, warnings-already-printed) for a job on this host."""
    env = environment.job_env(args, environment.parse_exports(args.exports), job_id)
    gpu_ids = gpus.of_job(args)
    none_named = None if args.no_gpu else gpus.none_named(env, gpu_ids)
    size = args.n
    gpu_of = None
    if args.no_gpu:
        gpu_of = lambda r: ""  # noqa: E731 - hide every GPU from every rank
        size = size or 1  # the CPU was asked for: one rank, and nothing to warn about
    elif size is None:
        if gpu_ids:
            size = len(gpu_ids) * args.ranks_per_gpu
        else:
            size = 1
            if not none_named:  # said below
                _warn("no GPU found: running 1 rank on the CPU (use -n N for N ranks, --no-gpu to "
                      "silence this)")
    if none_named:
        _warn(none_named)
    unmatched = None if args.no_gpu else gpus.unmatched(env, gpu_ids)
    if unmatched:
        _warn(unmatched)
    if gpu_ids and not args.no_gpu:
        per = args.ranks_per_gpu
        crowded = gpus.crowded(size, gpu_ids, per)
        if crowded:
            _warn(f"-n {size} is more than {crowded[0]}: running all {size} ranks on CPUs (use "
                  f"-n {per * len(gpu_ids)}, {crowded[1]})")
        gpu_of = lambda r: gpus.gpu_for(r, size, gpu_ids, per)  # noqa: E731
    cores = environment.usable_cores()
    if size > cores and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = "1"
        _warn(f"{size} ranks on {cores} cores: setting OMP_NUM_THREADS=1 for every rank (set "
              "it yourself, or -x OMP_NUM_THREADS=N, to choose)")
    base_argv = cmd.rank_argv(args.python_interpreter, command, module=args.module)
    argv_of = lambda r: list(base_argv)  # noqa: E731
    if args.pin_to_socket or args.pin_memory_to_socket:
        from tarantella.runner import pinning
        argv_of = pinning.pinned_argv_of(base_argv, args.pin_to_socket, args.pin_memory_to_socket,
                                         size)
    return local.rank_specs(argv_of, env, size, private_dir, args.output_on_all_devices,
                            gpu_of=gpu_of, stderr_of_all=args.stderr_of_all)


def _print_dry_run(specs, base_env):
    print(f"# tntrun --dry-run: {len(specs)} rank(s) on {platform.node()}, nothing started")
    for spec in specs:
        changed = {k: v for k, v in spec.env.items() if base_env.get(k) != v}
        print(f"# rank {spec.rank}")
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in changed.items()) + " "
              + shlex.join(spec.argv))


def _print_report(parts):
    """Print each part's text; a reader that stops early (`tntrun --version | head -2`)
    ends the report quietly, as other tools' reports do, instead of with a traceback."""
    try:
        for part in parts:
            print(part(), flush=True)
    except BrokenPipeError:
        # stdout is gone: point it at /dev/null so that the interpreter's own flush at
        # exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def main(argv=None):
    mark("tntrun: main", label="tntrun")
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "tntrun"
    if prog not in ("tntrun", "tarantella"):
        prog = "tntrun"
    parser, args, command = parse(argv, prog)
    if args.version:
        from tarantella.runner import frontend_info, transports
        return _print_report([_version, transports.describe, frontend_info.describe])
    try:
        if args.cleanup:
            from tarantella.runner import cleanup
            others = _other_hosts(args)
            if others:
                # the original `tarantella --hostfile hosts --cleanup` cleaned up every host
                # listed; taken without a word, the list made the user believe so here too
                _warn(f"--cleanup acts on this host only: it does not reach {', '.join(others)} "
                      "of the host list. Their ranks were started by the engine (mpirun, srun, "
                      "gaspi_run), which stops them when tntrun ends; to remove what is left there "
                      "(shared memory, temporary folders), run `tntrun --cleanup -- PROGRAM` on "
                      "each of those hosts (e.g. through ssh)")
            return cleanup.run(command, force=args.force)
        if not command:
            parser.error("missing PROGRAM: write `tntrun [options] -- PROGRAM [ARGS...]`, "
                         "e.g. tntrun -n 2 -- train.py")
        job_id = secrets.token_hex(16)
        unexpanded = environment.unexpanded_references(args.exports)
        if unexpanded:
            _warn(unexpanded)
        args.output_on_all_devices = environment.as_ranks_see_it(args, "TNT_OUTPUT_ON_ALL_DEVICES")
        args.one_line_report = environment.as_ranks_see_it(args, "TNT_LOG_LEVEL") == "ERROR"
        # the other ranks' logs go to their stderr, which a job on this host shows only for
        # rank 0 (across hosts the engine shows every rank's stderr)
        args.stderr_of_all = environment.as_ranks_see_it(args, "TNT_LOG_ON_ALL_DEVICES")
        from tarantella.runner import multi
        tasks = multi.step_task_count()
        if tasks:
            raise UsageError(
                f"tntrun is running as one of {tasks} tasks of a Slurm job step (srun -n {tasks} "
                "tntrun ...), so every task would start the whole job. Run tntrun once inside the "
                "allocation (salloc or sbatch, then `tntrun -- PROGRAM`: it calls srun itself), "
                f"or let srun start the ranks without tntrun: srun -n {tasks} python PROGRAM")
        if args.transport not in (None, "auto"):
            from tarantella.runner import transports
            why = transports.unavailable(args.transport)
            if why:
                _warn(f"--transport {args.transport} is not available on this host: {why}")
        in_slurm = multi.in_allocation()
        if args.transport == "mpi" and not (args.hostfile or args.hosts or in_slurm):
            # every byte over the mpi transport on this host: MPI must start the ranks (the
            # transport takes its ranks from MPI_COMM_WORLD), as with -H localhost:N
            args.hosts = f"localhost:{args.n or 1}"
        if args.hostfile or args.hosts or (in_slurm and (
                args.n_per_node is not None or len(multi.allocation_nodes()) > 1
                or multi.off_the_allocation())):
            # several hosts; inside a Slurm allocation of several nodes (or with
            # --n-per-node) its nodes, through srun; so too from salloc's shell on the login
            # node, for an allocation of one node (the ranks ran on the login node)
            return multi.run(args, command, job_id)
        if args.n_per_node is not None:
            # one host is a host too: N ranks on it, as torchrun --nproc_per_node N and
            # mpirun -npernode N run on one node
            here = multi.ranks_per_node(args)
            if args.n is not None and args.n != here:
                parser.error(f"-n {args.n} and --n-per-node {args.n_per_node} ({here} ranks on this host) "
                             "disagree: give one of them")
            args.n = here
        if args.dry_run:
            specs = _local_plan(args, command, job_id, private_dir=None)
            _print_dry_run(specs, os.environ)
            return 0
        private_dir = local.private_tempdir(job_id)
        try:
            specs = _local_plan(args, command, job_id, private_dir)
            # after the plan: a usage error of the options (exit 2) is named before the program
            problem = cmd.script_problem(args.python_interpreter, command, args.module)
            if problem:
                raise LaunchError(problem)
        except BaseException:
            import shutil
            shutil.rmtree(private_dir, ignore_errors=True)
            raise
        return local.run(specs, job_id, program=cmd.program_name(command, args.module), command=command,
                         one_line=args.one_line_report, private_dir=private_dir,
                         adopt=True)
    except UsageError as exc:
        parser.error(str(exc))
    except LaunchError as exc:
        print(f"tntrun: error: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
