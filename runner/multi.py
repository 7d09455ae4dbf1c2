"""A job on several hosts: pick the engine, build its command, print it (--dry-run) or run
it under the same supervision as local ranks."""
import os
import platform
import re
import shlex
import signal
import sys
import threading

from tarantella.runner import command as cmd
from tarantella.runner import engines, environment, gpus, hostfile, local, rank_report, report, shm
from tarantella.runner.environment import UsageError
from tarantella.common.engine_ranks import slurm_tasks_per_node
from tarantella.runner.supervise import JobResult, ProcResult, ProcSpec, root_cause


ENGINE_SETTLE_S = 10.0  # how long an engine may take to end the job after a rank failed


def _gpu_places(args):
    """Ranks a host of this one's GPUs holds: --ranks-per-gpu on each, as on one host. One per
    GPU before: `-H a,b --ranks-per-gpu 2` on hosts of 2 GPUs ran 2 ranks per host, both on GPU 0,
    the other GPU idle, without a word."""
    return len(gpus.of_job(args)) * args.ranks_per_gpu


def ranks_per_node(args):
    """Ranks per host from --n-per-node (N, gpu, cpu or auto), or None."""
    value = args.n_per_node
    if value is None:
        return None
    if value in ("gpu", "auto"):
        count = _gpu_places(args)
        if value == "gpu" and not count:
            raise UsageError("--n-per-node gpu: no GPU found on this host; give a number, or "
                             "--n-per-node cpu")
        return count or environment.usable_cores()
    if value == "cpu":  # the cores this launcher may run on (taskset, cpuset, Slurm), as the ranks count them
        return environment.usable_cores()
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"--n-per-node expects a number, gpu, cpu or auto. Received: {value!r}") from None
    if number < 1:
        raise UsageError(f"--n-per-node must be at least 1. Received: {value}")
    return number


def expand_nodelist(text):
    """Slurm's compressed node list, "node[1-3,7],gpu01" -> [node1, node2, node3, node7,
    gpu01] (zero padding kept); None if it cannot be read (e.g. two bracket groups in one
    name: the caller then shows the nodes by number)."""
    items = re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text or "")
    if ",".join(items) != (text or ""):
        return None
    names = []
    for item in items:
        match = re.fullmatch(r"([^\[\]]+)(?:\[([^\]]*)\])?", item)
        if not match:
            return None
        stem, ranges = match.groups()
        if ranges is None:
            names.append(stem)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                return None
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{stem}{number:0{len(low)}d}")
    return names or None


def in_allocation(environ=None):
    """True inside a Slurm allocation (salloc, sbatch) where tntrun itself is not one of
    several tasks of a job step."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("SLURM_JOB_ID")) and not step_task_count(environ)


def step_task_count(environ=None):
    """N when tntrun runs as one of N > 1 tasks of a Slurm job step (`srun -n N tntrun`)."""
    environ = os.environ if environ is None else environ
    if "SLURM_PROCID" not in environ or not environ.get("SLURM_STEP_ID"):
        return 0
    try:
        count = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or 1)
    except ValueError:
        return 0
    return count if count > 1 else 0


def inside_step(environ=None):
    """True when tntrun runs as the task of a Slurm job step (`srun -N1 -n1 tntrun`, a shell
    from `srun --pty bash`), not in an allocation's shell or batch script (no SLURM_STEP_ID)."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("SLURM_STEP_ID"))


def off_the_allocation(environ=None):
    """True where tntrun runs outside the allocation's nodes: in the shell of `salloc`, which
    runs on the login node (not in a batch script or a step: Slurm sets SLURMD_NODENAME
    there). Ranks started here would run on the login node, not on the nodes allocated."""
    environ = os.environ if environ is None else environ
    if environ.get("SLURMD_NODENAME"):
        return False
    names = expand_nodelist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"))
    if not names:
        return False  # unreadable: as before, here
    short = platform.node().split(".")[0]
    return short not in {n.split(".")[0] for n in names}


def allocation_nodes(environ=None):
    environ = os.environ if environ is None else environ
    try:
        count = int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
    except ValueError:
        count = 1
    names = expand_nodelist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"))
    if not names or len(names) != count:
        names = [f"<slurm node {i}>" for i in range(count)]
    return names


def _slurm_placement(args, per_node, environ=None):
    """[(node, ranks)] in the allocation: --n-per-node, else -n spread as srun spreads it
    (blocks, the first nodes one more; one on each of the first -n nodes when -n is less
    than the nodes), else the tasks the allocation was asked for
    (SLURM_NTASKS_PER_NODE, or SLURM_TASKS_PER_NODE when --ntasks was given), else one
    per GPU of this node, else one per node."""
    environ = os.environ if environ is None else environ
    nodes = allocation_nodes(environ)
    if per_node is not None:
        return [(n, per_node) for n in nodes]
    if args.n is not None:
        nodes = nodes[:args.n]  # fewer ranks than nodes: one on each of the first nodes
        base, extra = divmod(args.n, len(nodes))
        return [(n, base + (i < extra)) for i, n in enumerate(nodes)]
    if environ.get("SLURM_NTASKS_PER_NODE", "").isdigit():
        return [(n, int(environ["SLURM_NTASKS_PER_NODE"])) for n in nodes]
    counts = slurm_tasks_per_node(environ.get("SLURM_TASKS_PER_NODE"))
    if environ.get("SLURM_NTASKS") and counts and len(counts) == len(nodes):
        return list(zip(nodes, counts))
    per = _gpu_places(args) or 1
    return [(n, per) for n in nodes]


def placement(args):
    """([(host, ranks on it)], named): from --hostfile / --hosts (named), or the Slurm
    allocation's nodes."""
    if args.hostfile and args.hosts:
        raise UsageError("give --hostfile or --hosts, not both")
    hosts = hostfile.of_args(args)
    per_node = ranks_per_node(args)
    if hosts is None:  # inside Slurm without a host list: the allocation's nodes
        return _slurm_placement(args, per_node), False
    if getattr(args, "prog", "tntrun") == "tarantella" and args.n is not None \
            and per_node is None and len(hosts) > 1:
        # The original `tarantella` read -n beside --hostfile as the ranks of each host (its
        # `-n 2` on two nodes started 4 ranks); tntrun reads it as the total, as mpirun does.
        # Under the original's name the job would silently run with fewer ranks (2 on two
        # CPU nodes) or other GPUs than the script was written for: refuse, saying which to write.
        raise UsageError(
            f"-n {args.n} with a host list of {len(hosts)} hosts: the original tarantella "
            f"started -n ranks on each host ({args.n} x {len(hosts)} = {args.n * len(hosts)}), "
            "where this one reads -n as the total (as mpirun and srun do). Write "
            f"--n-per-node {args.n} for {args.n} ranks on each host, or tntrun -n TOTAL "
            f"(docs/migration.md). Received: -n {args.n}, {len(hosts)} hosts")
    if per_node is None and args.n is not None and len(hosts) == 1 and hosts[0][1] is None:
        # one host without slots: -n ranks there. Per host and in total are the same number,
        # so this is how the original `tarantella --hostfile <one host> -n 4` ran (4 ranks),
        # and how mpirun reads it; the default below (one rank per GPU, else one) would
        # refuse the -n given
        per_node = args.n
    if per_node is None and all(s is None for _, s in hosts):
        # the seed's default: one rank per GPU of a node (nodes are alike), else one, with a
        # WARNING as on one host (and in the original `tarantella`), unless --no-gpu asked for it
        per_node = _gpu_places(args) or 1
        if not args.no_gpu and per_node == 1 and not gpus.of_job(args):
            print("tntrun: WARNING: no GPU found on this host: running 1 rank per host on the CPU "
                  "(use --n-per-node N for N ranks per host, --no-gpu to silence this)",
                  file=sys.stderr, flush=True)
    if len(hosts) > 1:
        twice = hostfile.same_machine([h for h, _ in hosts])
        if twice:
            first, second, why = twice
            raise UsageError(
                f"{'--hostfile ' + args.hostfile if args.hostfile else '--hosts'} names one machine twice: "
                f"{first!r} and {second!r} {why}. List each machine once, with the slots of all its ranks "
                f"({first}:N): the engine would take the two for one node and refuse the job in its own words")
    result = [(h, per_node if per_node is not None else (s or 1)) for h, s in hosts]
    total = sum(n for _, n in result)
    if args.n is not None and args.n != total:
        per = {n for _, n in result}
        raise UsageError(
            f"-n {args.n} does not match the host list: {len(result)} host(s) with "
            f"{'/'.join(map(str, sorted(per)))} rank(s) each make {total} ranks in total. With "
            "--hostfile, -n is read as the total (as mpirun and srun read it); for ranks per "
            "host use --n-per-node")
    return result, True


def choose_engine(args, spots):
    transport = args.transport or os.environ.get("TNT_TRANSPORT") or "auto"
    if transport == "shm" and len(spots) > 1:
        given = "--transport shm" if args.transport else "TNT_TRANSPORT=shm"
        raise UsageError(f"{given} works on one host only, and the job has {len(spots)} "
                         f"({', '.join(h for h, _ in spots)}): use --transport auto, mpi or gpi2")
    if transport == "gpi2":
        return "gaspi_run", transport
    if os.environ.get("SLURM_JOB_ID"):
        return "srun", transport
    # shm on the one host named (-H localhost:4): the engine starts the ranks there, and
    # they meet in shared memory as tntrun's own ranks do
    if transport == "auto" and not (engines.shutil.which("mpirun") or engines.shutil.which("mpiexec")) \
            and engines.shutil.which("gaspi_run"):
        return "gaspi_run", "gpi2"
    return "mpi", transport


def _info(args, message):
    """An INFO line of tntrun's own, shown with --log-level INFO or DEBUG (or --verbose)."""
    level = (args.log_level or os.environ.get("TNT_LOG_LEVEL") or "WARNING").upper()
    if level in ("INFO", "DEBUG", "TRACE"):
        print(f"tntrun: INFO: {message}", file=sys.stderr, flush=True)


class Plan:
    def __init__(self, engine, argv, env, files, placement, shown=None):
        self.engine, self.argv, self.env, self.files, self.placement = engine, argv, env, files, placement
        self.shown = argv if shown is None else shown  # the command as --dry-run prints it


def _locate(find, name, dry_run):
    """find() the engine; a dry run goes on without it (printing the command is the point of
    a dry run, e.g. to check it before installing the engine), with a WARNING."""
    try:
        return find()
    except engines.EngineMissing as exc:
        if not dry_run:
            raise
        print(f"tntrun: WARNING: {exc}. The dry run shows the command all the same",
              file=sys.stderr)
        return name


def build(args, command, job_id, workdir):
    """The engine command, its environment and the files it needs (written into `workdir`)."""
    spots, named = placement(args)
    total = sum(n for _, n in spots)
    engine, transport = choose_engine(args, spots)
    exports = environment.parse_exports(args.exports)
    env = environment.job_env(args, exports, job_id)
    if not args.transport and transport != "auto":
        env["TNT_TRANSPORT"] = transport
    names = environment.exported_names(args, exports)
    if "TNT_TRANSPORT" in env and "TNT_TRANSPORT" not in names:
        names.append("TNT_TRANSPORT")
    per_node = engines.uniform(spots)
    cores = environment.usable_cores()
    if (per_node or max(n for _, n in spots)) > cores and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = "1"
        names.append("OMP_NUM_THREADS")
        print(f"tntrun: WARNING: {per_node or max(n for _, n in spots)} ranks per host on {cores} cores: setting "
              "OMP_NUM_THREADS=1 for every rank", file=sys.stderr)
    mpi_names = names + [n for n in engines.PASS_THROUGH if n in env and n not in names]
    # Open MPI's mpirun and gaspi_run hand tntrun's environment only to ranks on this host:
    # the others get it named one by one (Hydra and srun pass the whole of it themselves)
    everything = names + [n for n in environment.forwarded_names(env) if n not in names]
    user_argv = cmd.rank_argv(args.python_interpreter, command, module=args.module)
    # --report: the wrapper tells tntrun, through the engine's stderr, why a rank failed
    wrapper = [sys.executable, "-m", "tarantella.runner.rank", "--report", f"--size={total}"]
    if per_node:
        wrapper.append(f"--per-node={per_node}")
    else:  # hosts that differ: where the engine gives no local rank (gaspi_run), it comes from these
        wrapper.append("--per-host=" + ",".join(str(n) for _, n in spots))
    if args.ranks_per_gpu != 1:
        wrapper.append(f"--ranks-per-gpu={args.ranks_per_gpu}")
    # mpirun (--tag-output), mpiexec (-prepend-rank) and srun (--label) label every rank's lines
    # under --output-on-all-devices; gaspi_run cannot, so the rank wrapper does (else the
    # ranks' lines came unlabelled, mixed)
    label = args.output_on_all_devices and engine == "gaspi_run"
    for flag, on in (("--output-all", args.output_on_all_devices), ("--label", label), ("--no-gpu", args.no_gpu),
                     ("--pin-cpu", args.pin_to_socket), ("--pin-memory", args.pin_memory_to_socket)):
        if on:
            wrapper.append(flag)
    rank_cmd = wrapper + ["--"] + user_argv
    files = {}
    if engine == "gaspi_run":
        path = _locate(lambda: engines.find("gaspi_run", "to start ranks with --transport gpi2"),
                       "gaspi_run", args.dry_run)
        # gaspi_run's script must be visible on every host: it goes into the (shared) cwd,
        # as the original tarantella command did; other engines read their files here only
        shared = os.getcwd()
        mfile = os.path.join(shared, f".tnt-{job_id[:12]}.machinefile")
        script = os.path.join(shared, f".tnt-{job_id[:12]}.sh")
        # gaspi_run stops a job with `killall -9 SCRIPT` on every host: the wrapper stops its
        # program when the script dies (engines.gaspi_script)
        rank_cmd = wrapper + ["--die-with-script", "--"] + user_argv
        files[mfile] = engines.gaspi_machinefile(spots)
        files[script] = engines.gaspi_script(env, everything, rank_cmd, os.getcwd())
        argv = engines.gaspi(path, spots, mfile, script)
        real_ssh = engines.shutil.which("ssh", path=env.get("PATH"))
        real_mktemp = engines.shutil.which("mktemp", path=env.get("PATH"))
        if real_mktemp:  # its temporary files are noted, for us to remove (engines.py)
            files[os.path.join(workdir, "mktemp")] = engines.gaspi_mktemp_shim(
                real_mktemp, os.path.join(workdir, engines.ENGINE_TEMP_FILES))
        if real_ssh:
            # gaspi_run does not notice a host its ssh could not start ranks on (the others
            # would wait until TNT_TIMEOUT_S): its ssh is ours, which reports it (gaspi_ssh.py).
            lock = os.path.join(workdir, "ranks.lock")
            files[os.path.join(workdir, "ssh")] = engines.gaspi_ssh_shim(sys.executable, real_ssh,
                                                                          job_id, mfile, lock)
            # gaspi_run ends with rank 0, the others' ssh then killed with it: wait for them
            argv = engines.gaspi_until_ranks_end(sys.executable, lock, mfile, argv)
        if real_ssh or real_mktemp:
            # only gaspi_run's PATH: the ranks' own PATH is the one the script exports
            env = dict(env, PATH=workdir + os.pathsep + env.get("PATH", ""))
    elif engine == "srun":
        path = _locate(lambda: engines.find("srun", "inside a Slurm allocation"), "srun",
                       args.dry_run)
        if named and not per_node:
            raise UsageError("under Slurm every host runs the same number of ranks: give "
                             "--n-per-node N")
        in_step = inside_step()
        argv = engines.srun(path, spots, rank_cmd, args.output_on_all_devices, named,
                            in_step=in_step)
        left_out = engines.SRUN_LAYOUT_VARIABLES + (engines.STEP_LAYOUT_VARIABLES if in_step else ())
        env = {k: v for k, v in env.items() if k not in left_out}
    else:
        path, flavour = _locate(engines.mpi_launcher, ("mpirun", "openmpi"), args.dry_run)
        if flavour == "mpich":
            mfile = os.path.join(workdir, f"tnt-{job_id[:12]}.machinefile")
            files[mfile] = engines.mpich_machinefile(spots)
            argv = engines.mpich(path, spots, env, mpi_names, rank_cmd,
                                 args.output_on_all_devices, mfile)
            engine = "mpiexec (MPICH/Hydra)"
        else:
            as_root = os.geteuid() == 0
            if as_root:
                _info(args, "running as root: passing --allow-run-as-root to mpirun (Open MPI "
                            "refuses root without it; horovodrun passes it too)")
            argv = engines.openmpi(path, spots, everything, rank_cmd, args.output_on_all_devices,
                                   allow_root=as_root)
            engine = "mpirun (Open MPI)"
    shown = argv
    if engine != "gaspi_run":  # (gaspi_run's script bootstraps its wrapper itself)
        # where Tarantella cannot be imported on a host, its ranks say so, naming their rank
        # and host: the report named the engine alone, with Python's words "No module named
        # tarantella" (the engine does not say whose they are)
        argv = engines.bootstrapped_tail(argv, rank_cmd)
    return Plan(engine, argv, env, files, spots, shown)


def rank_results(records):
    """ProcResults of the ranks whose failure records came from their hosts, by rank."""
    results = []
    for rec in records:
        rank = rec.get("rank")
        spec = ProcSpec(argv=[], env={}, label=str(rank), rank=rank,
                        local_rank=rec.get("local_rank"), host=rec.get("host") or "?")
        res = ProcResult(spec, rec.get("pid"), returncode=rec.get("returncode"),
                         ended_at=rec.get("ended_at") or 0.0, stopped=bool(rec.get("stopped")),
                         stderr_tail=str(rec.get("stderr_tail") or "").encode(),
                         error=rec.get("error"))
        res.stopped_at = rec.get("stopped_at")
        results.append(res)
    return sorted(results, key=lambda r: (r.spec.rank is None, r.spec.rank or 0))


def ranks_job(job, records, engine_name, joins=None):
    """The job as its ranks saw it: when the engine failed (or a rank reported a collective's
    error that its program went on after) and ranks reported failures,
    the root cause is the rank that failed first on its own (named with its host), not the
    engine, and tntrun exits with that rank's status (srun would say 143 for the ranks it
    stopped); when tntrun ended the job because ranks waited in tnt.init() for one that
    had ended without joining (`joins`, Joins.found), that rank; else the engine's job
    unchanged."""
    if not records or job.interrupted_by is not None:
        return job
    found = joins.found if joins is not None else None
    caught = any((rec.get("error") or {}).get("caught") is True for rec in records if isinstance(rec, dict))
    # a rank that failed on its own (not stopped): gaspi_run exits with its master rank's status
    # alone, so a job whose rank 0 ended well (exit 0) while others failed (their PeerLostError
    # after it had shut down early) ended with exit 0 and no report
    failed = any(rec.get("returncode") not in (0, None) and not rec.get("stopped")
                 for rec in records if isinstance(rec, dict))
    if job.root_cause is None and not job.stalled and not caught and not found and not failed:
        # (with `caught`, a rank went on after a collective of its failed and exited 0, as
        # the engine then did: the job failed all the same, see supervise.failed)
        return job
    results = rank_results(records)
    root = None
    if found:
        root = next((res for res in results if res.spec.rank == found["rank"]), None)
        if root is not None:
            root.error = {"message": found["message"], "timestamp": root.ended_at}
    if root is None:
        root = root_cause(results, report.error_of, lambda res: getattr(res, "stopped_at", None))
    if root is None:
        return job
    return JobResult(results=results, root_cause=root, started_at=job.started_at,
                     engine=job.root_cause or job.results[0], stopped_by=engine_name, stalled=job.stalled)


class Joins:
    """What tntrun learns, across hosts, of the ranks' tnt.init(): each rank's wrapper notes
    every tnt.init() its program begins, and how many it had begun when it ended
    (rank.py). A rank that waits in tnt.init() (it began more than another one that has
    ended with exit code 0) waits for ever: every rank must join, and that one never will.
    On one host tntrun tells the waiting ranks (TNT_LAUNCHER_DIR), which fail at once naming
    it; across hosts it cannot reach them (the engine, MPI_Init or gaspi_proc_init waited
    until TNT_TIMEOUT_S), and ends the job itself: `found` is then that rank's description."""

    def __init__(self):
        self._lock = threading.Lock()
        self.begun = {}   # rank -> (tnt.init() calls it began, host)
        self.ended = {}   # rank -> its end record
        self.found = None  # {"rank", "host", "waiting", "message", "reason"}

    def take(self, record, engine_name):
        """Note a record (a note or an end); the finding, the first time there is one."""
        rank = record.get("rank")
        if not isinstance(rank, int):
            return None
        with self._lock:
            if self.found is not None:
                return None
            if record.get("note") == "joining":
                count = record.get("joins")
                if isinstance(count, int):
                    self.begun[rank] = (max(count, self.begun.get(rank, (0, None))[0]), record.get("host") or "?")
            elif record.get("note") is None:
                self.ended[rank] = record
            for gone, rec in sorted(self.ended.items()):
                joined = rec.get("joins")
                if (rec.get("returncode") != 0 or rec.get("stopped") or not isinstance(joined, int)
                        or (rec.get("error") or {}).get("caught") is True):
                    continue  # a failure (reported as such), a stop, or a wrapper that does not count
                waiting = sorted((q, n, host) for q, (n, host) in self.begun.items()
                                 if q not in self.ended and n > joined)
                if waiting:
                    self.found = self._finding(gone, rec, joined, waiting, engine_name)
                    return self.found
        return None

    @staticmethod
    def _finding(gone, rec, joined, waiting, engine_name):
        host = rec.get("host") or "?"
        first, began, where = waiting[0]
        others = f" (and {len(waiting) - 1} more)" if len(waiting) > 1 else ""
        before = ("before it joined the job" if joined == 0 else
                  f"after {joined} tnt.init() call{'s' if joined > 1 else ''}, where rank {first} began {began}")
        message = (f"rank {gone} ended (exit code 0) {before}, while rank {first} on {where}{others} waited for it in "
                   "tnt.init(): every rank must make the same collective calls (does the program return or exit on "
                   "some ranks before its first collective?)")
        reason = (f"rank {gone} ended on {host} (exit code 0) without joining the job, while rank {first}{others} "
                  f"waits for it in tnt.init(), and {engine_name} would wait too")
        return {"rank": gone, "host": host, "waiting": first, "message": message, "reason": reason}


def stall_watch(collector, engine_name, seconds=ENGINE_SETTLE_S, joins=None):
    """A local.run `watch`: at a rank's first failure record, the engine gets `seconds` to
    end the job on every host, as mpirun and srun do at once; if it has not, tntrun stops it
    (SIGTERM, SIGKILL after the grace period), and the ranks it could still reach with it.
    Where a host was cut off, its daemon cannot be reached: the ranks there end on their own
    (they name the silent hosts' ranks within the heartbeat bound and exit). With `joins`
    (Joins), a rank that ended (exit 0) without joining the job while others wait for it in
    tnt.init() ends the job at once."""
    def watch(supervisor):
        def on_record(record):
            host = record.get("host") or "?"
            if joins is not None:
                found = joins.take(record, engine_name)
                if found is not None:
                    supervisor.stall_after(found["reason"], 0)
                    return
            if record.get("note") is not None:
                return  # a rank began tnt.init() (for `joins` only)
            if record.get("not_started"):
                # gaspi_run's ssh could not start the ranks of a host (gaspi_ssh.py): the
                # others would wait for them until TNT_TIMEOUT_S, and gaspi_run with them
                supervisor.stall_after(f"{engine_name} could not start the ranks on {host}", 0)
                return
            if record.get("returncode") == 0:
                # it ended well, or its program caught a collective's error and exited 0
                # (supervise.failed): it counts at the end, and the others may still be saving
                # what they can
                return
            supervisor.stall_after(f"rank {record.get('rank')} failed on {host} and {engine_name} had not ended "
                                   f"the job {seconds:g} s later", seconds)
        collector.on_record = on_record
    return watch


class AdviceFilter:
    """An engine's output filter: `inner`'s output passed on, with `advice` (a line) added
    once after the first whole line that holds `words` (an engine's error that tntrun knows
    the fix of)."""

    def __init__(self, inner, words, advice):
        self.inner, self.words, self.advice = inner, words, advice
        self.line = b""  # the current line so far (words may come in two chunks)

    def feed(self, chunk):
        return self._look(self.inner.feed(chunk))

    def flush(self):
        out = self._look(self.inner.flush())
        if self.advice is not None and self.words in self.line:  # a last line without newline
            out += b"\n" + self.advice
        return out

    def _look(self, out):
        if self.advice is None or not out:
            return out
        pieces = out.split(b"\n")
        result = []
        for i, piece in enumerate(pieces):
            self.line = (self.line + piece)[-4096:]
            result.append(piece)
            if i == len(pieces) - 1:
                break
            result.append(b"\n")
            if self.words in self.line:
                result.append(self.advice)
                self.advice = None
                result.append(b"\n".join(pieces[i + 1:]))
                break
            self.line = b""
        return b"".join(result)

def run(args, command, job_id):
    private_dir = local.private_tempdir(job_id)
    plan = None
    try:
        plan = build(args, command, job_id, private_dir)
        if args.dry_run:
            hosts = ", ".join(f"{h}:{n}" for h, n in plan.placement)
            print(f"# tntrun --dry-run: {sum(n for _, n in plan.placement)} rank(s) on {hosts} "
                  f"through {plan.engine}; nothing started")
            for path, text in plan.files.items():
                print(f"# file {path}:")
                print("".join("#   " + ln + "\n" for ln in text.splitlines()), end="")
            changed = {k: v for k, v in plan.env.items() if os.environ.get(k) != v}
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in changed.items()) + " "
                  + shlex.join(plan.shown))
            return 0
        for path, text in plan.files.items():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
            except OSError as exc:  # gaspi_run's files go into the current folder (shared by the hosts)
                where = ("the current folder, which every host must see: run tntrun from a writable "
                         "shared folder" if os.path.dirname(path) == os.getcwd() else "tntrun's own folder")
                print(f"tntrun: error: cannot write {path} ({exc.strerror}): {plan.engine}'s files go into "
                      f"{where}", file=sys.stderr)
                return 1
        collector = rank_report.Collector(job_id)
        name = "gaspi_run" if plan.engine == "gaspi_run" else os.path.basename(plan.argv[0])  # not bash
        stderr_filter = rank_report.MarkerFilter(collector)
        if plan.engine == "srun":  # srun's own words say nothing of what to change
            stderr_filter = AdviceFilter(stderr_filter, engines.SRUN_TOO_FEW_CPUS,
                                         engines.srun_too_few_cpus_advice(plan.placement, os.environ))
        spec = ProcSpec(argv=plan.argv, env=plan.env, label=name, host=platform.node(),
                        stdin=True, stderr_filter=stderr_filter,
                        # srun SIGKILLs its tasks on SIGTERM ("forcing job termination"): the ranks
                        # had no grace period; SIGINT it passes on to them (--disable-status)
                        stop_signal=signal.SIGINT if plan.engine == "srun" else signal.SIGTERM,
                        # Ctrl+Z can pause ranks that all run here (--transport mpi -n N): Open
                        # MPI forks them below mpirun (others may reach even this host by ssh)
                        on_this_host=plan.engine == "mpirun (Open MPI)" and hostfile.this_host_only(
                            [h for h, _ in plan.placement]),
                        # (gaspi_run's ssh commands end in 2>&1, which our ssh, gaspi_ssh.py,
                        # takes off: a record that came on its stdout all the same is taken too)
                        stdout_filter=(rank_report.MarkerFilter(collector)
                                       if plan.engine == "gaspi_run" else None))
        joins = Joins()
        return local.run([spec], job_id, program=cmd.program_name(command, args.module), command=command,
                         one_line=args.one_line_report, private_dir=private_dir,
                         files=list(plan.files), watch=stall_watch(collector, name, joins=joins),
                         translate=lambda job: ranks_job(job, collector.records, name, joins), adopt=True)
    except engines.EngineMissing as exc:
        print(f"tntrun: error: {exc}", file=sys.stderr)
        return 127
    finally:
        import shutil

        if plan is not None and not args.dry_run:
            for path in list(plan.files) + engines.engine_temp_files(private_dir):
                try:
                    os.unlink(path)
                except OSError:
                    pass
        shutil.rmtree(private_dir, ignore_errors=True)
        shm.remove(job_id)
