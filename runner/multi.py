"""A job on several hosts: pick the engine, build its command, print it (--dry-run) or run
it under the same supervision as local ranks."""
import os
import platform
import shlex
import sys

from tarantella.runner import command as cmd
from tarantella.runner import engines, environment, gpus, hostfile, local, shm
from tarantella.runner.environment import UsageError
from tarantella.runner.supervise import ProcSpec


def _per_node(args):
    """Ranks per host from --n-per-node (N, gpu, cpu or auto), or None."""
    value = args.n_per_node
    if value is None:
        return None
    if value in ("gpu", "auto"):
        count = 0 if args.no_gpu else len(gpus.detect())
        if value == "gpu" and not count:
            raise UsageError("--n-per-node gpu: no GPU found on this host; give a number, or "
                             "--n-per-node cpu")
        return count or (os.cpu_count() or 1)
    if value == "cpu":
        return os.cpu_count() or 1
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"--n-per-node expects a number, gpu, cpu or auto. Received: {value!r}") from None
    if number < 1:
        raise UsageError(f"--n-per-node must be at least 1. Received: {value}")
    return number


def placement(args):
    """[(host, ranks on it)] from --hostfile / --hosts (or the Slurm allocation)."""
    if args.hostfile and args.hosts:
        raise UsageError("give --hostfile or --hosts, not both")
    hosts = (hostfile.parse_hostfile(args.hostfile) if args.hostfile
             else hostfile.parse_hosts(args.hosts) if args.hosts else None)
    per_node = _per_node(args)
    if hosts is None:  # inside Slurm without a host list: the allocation's nodes
        nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
        per = per_node or 1
        return [(f"<slurm node {i}>", per) for i in range(nodes)], False
    if per_node is None and all(s is None for _, s in hosts):
        # the seed's default: one rank per GPU of a node (nodes are alike), else one
        per_node = (0 if args.no_gpu else len(gpus.detect())) or 1
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


def choose_engine(args):
    transport = args.transport or os.environ.get("TNT_TRANSPORT") or "auto"
    if transport == "shm":
        raise UsageError("--transport shm works on one host only; with several hosts use auto, "
                         "mpi or gpi2")
    if transport == "gpi2":
        return "gaspi_run", transport
    if os.environ.get("SLURM_JOB_ID"):
        return "srun", transport
    if transport == "auto" and not (engines.shutil.which("mpirun") or engines.shutil.which("mpiexec")) \
            and engines.shutil.which("gaspi_run"):
        return "gaspi_run", "gpi2"
    return "mpi", transport


class Plan:
    def __init__(self, engine, argv, env, files, placement):
        self.engine, self.argv, self.env, self.files, self.placement = engine, argv, env, files, placement


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
    engine, transport = choose_engine(args)
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
        print(f"tntrun: WARNING: {per_node} ranks per host on {cores} cores: setting "
              "OMP_NUM_THREADS=1 for every rank", file=sys.stderr)
    mpi_names = names + [n for n in engines.PASS_THROUGH if n in env and n not in names]
    user_argv = cmd.rank_argv(args.python_interpreter, command, module=args.module)
    wrapper = [sys.executable, "-m", "tarantella.runner.rank", f"--size={total}"]
    if per_node:
        wrapper.append(f"--per-node={per_node}")
    for flag, on in (("--output-all", args.output_on_all_devices), ("--no-gpu", args.no_gpu),
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
        files[mfile] = engines.gaspi_machinefile(spots)
        files[script] = engines.gaspi_script(env, names, rank_cmd, os.getcwd())
        argv = engines.gaspi(path, spots, mfile, script)
    elif engine == "srun":
        path = _locate(lambda: engines.find("srun", "inside a Slurm allocation"), "srun",
                       args.dry_run)
        if named and not per_node:
            raise UsageError("under Slurm every host runs the same number of ranks: give "
                             "--n-per-node N")
        argv = engines.srun(path, spots, rank_cmd, args.output_on_all_devices, named)
    else:
        path, flavour = _locate(engines.mpi_launcher, ("mpirun", "openmpi"), args.dry_run)
        if flavour == "mpich":
            mfile = os.path.join(workdir, f"tnt-{job_id[:12]}.machinefile")
            files[mfile] = engines.mpich_machinefile(spots)
            argv = engines.mpich(path, spots, env, mpi_names, rank_cmd,
                                 args.output_on_all_devices, mfile)
            engine = "mpiexec (MPICH/Hydra)"
        else:
            argv = engines.openmpi(path, spots, mpi_names, rank_cmd, args.output_on_all_devices)
            engine = "mpirun (Open MPI)"
    return Plan(engine, argv, env, files, spots)


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
                  + shlex.join(plan.argv))
            return 0
        for path, text in plan.files.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        spec = ProcSpec(argv=plan.argv, env=plan.env, label=os.path.basename(plan.argv[0]),
                        host=platform.node(), stdin=True)
        return local.run([spec], job_id, program=command[0], command=command,
                         one_line=(args.log_level == "ERROR"), private_dir=private_dir,
                         files=list(plan.files))
    except engines.EngineMissing as exc:
        print(f"tntrun: error: {exc}", file=sys.stderr)
        return 127
    finally:
        import shutil

        if plan is not None and not args.dry_run:
            for path in plan.files:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        shutil.rmtree(private_dir, ignore_errors=True)
        shm.remove(job_id)
