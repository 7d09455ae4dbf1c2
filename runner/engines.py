"""Command builders for the engines that start ranks on several hosts.

tntrun never starts remote processes itself: it builds the command of an engine the cluster
already trusts and runs it under supervision (supervise.py). Every engine runs the same
rank wrapper on every host (`python -m tarantella.runner.rank ... -- PROGRAM ...`, see
rank.py), which turns the engine's placement variables into the TNT_* contract and makes the
per-host choices (GPU, pinning, output) on the host where the rank runs.

- OpenMPI: mpirun [--allow-run-as-root] -np T --host h1:N,h2:N -npernode N --bind-to none -x NAME ...
- MPICH/Hydra (and Intel MPI): mpiexec -n T -f MACHINEFILE -ppn N -genv NAME VALUE ...
- Slurm (inside an allocation): srun --ntasks=T --ntasks-per-node=N --nodes=H [--nodelist=...]
  --export=ALL --kill-on-bad-exit=1
- GPI-2: gaspi_run -n T -m MACHINEFILE SCRIPT (gaspi_run forwards no environment, so SCRIPT
  exports it, as the original tarantella command did)
"""
import os
import shlex
import shutil
import subprocess

from tarantella.runner import rank_report

INSTALL = {
    "mpirun": "install Open MPI (Debian/Ubuntu: apt-get install openmpi-bin; RHEL/Fedora: dnf "
              "install openmpi) or MPICH (apt-get install mpich), or load your cluster's MPI module",
    "srun": "srun is Slurm's launcher: run inside an allocation on a node where Slurm is installed",
    "gaspi_run": "install GPI-2 (https://github.com/cc-hpc-itwm/GPI-2, ./install.sh) and put its "
                 "bin/ directory on PATH, or use --transport mpi",
}
# inherited by ranks through the engine besides what tntrun sets itself
PASS_THROUGH = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "GPI2_HOME")  # GPI2_HOME: the gpi2 plugin finds GPI-2 by it on every host


class EngineMissing(Exception):
    """The engine a multi-host job needs is not installed."""


def find(name, why):
    path = shutil.which(name)
    if not path:
        raise EngineMissing(f"{name} not found on PATH, needed {why}: {INSTALL[name]}")
    return path


def mpi_launcher():
    """(path, flavour) of the MPI launcher: 'openmpi' or 'mpich' (Hydra's option style)."""
    # mpiexec.hydra: MPICH's launcher under its own name (installed beside Open MPI's mpirun)
    path = shutil.which("mpirun") or shutil.which("mpiexec") or shutil.which("mpiexec.hydra")
    if not path:
        raise EngineMissing(f"mpirun not found on PATH, needed to start ranks on several hosts "
                            f"with --transport mpi: {INSTALL['mpirun']}")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        text = (out.stdout + out.stderr).lower()
    except (OSError, subprocess.SubprocessError):
        text = ""
    if "hydra" in text or "mpich" in text or "intel(r) mpi" in text:
        return path, "mpich"
    return path, "openmpi"


def uniform(placement):
    counts = {n for _, n in placement}
    return counts.pop() if len(counts) == 1 else None


def openmpi(mpirun, placement, names, rank_cmd, output_all, allow_root=False):
    total = sum(n for _, n in placement)
    argv = [mpirun] + (["--allow-run-as-root"] if allow_root else [])
    argv += ["-np", str(total), "--host", ",".join(f"{h}:{n}" for h, n in placement)]
    per_node = uniform(placement)
    if per_node:
        argv += ["-npernode", str(per_node)]
    # OpenMPI binds each rank to one core by default: a rank's threads would share it.
    # Pinning, when asked, is done by the rank wrapper (numactl), as on one host.
    argv += ["--bind-to", "none"]
    if output_all:
        argv.append("--tag-output")
    for name in names:
        argv += ["-x", name]
    return argv + rank_cmd


def mpich(mpiexec, placement, env, names, rank_cmd, output_all, machinefile):
    total = sum(n for _, n in placement)
    argv = [mpiexec, "-n", str(total), "-f", machinefile]
    per_node = uniform(placement)
    if per_node:
        argv += ["-ppn", str(per_node)]
    if output_all:
        argv.append("-prepend-rank")
    for name in names:
        argv += ["-genv", name, env[name]]
    return argv + rank_cmd


def mpich_machinefile(placement):
    return "".join(f"{h}:{n}\n" for h, n in placement)


# srun reads these as its options (srun(1), INPUT ENVIRONMENT VARIABLES); salloc and sbatch
# set them from the allocation's request (`--ntasks-per-node=2`), so that inside it they would
# ask for a layout of their own beside the counts tntrun gives: srun warned "can't honor
# --ntasks-per-node set to 2 which doesn't match the requested tasks 3 ..." for `tntrun -n 3`.
# tntrun gives every count itself (srun below): they are left out of srun's environment
SRUN_LAYOUT_VARIABLES = ("SLURM_NTASKS_PER_NODE", "SLURM_NTASKS_PER_SOCKET", "SLURM_NTASKS_PER_CORE",
                         "SLURM_NTASKS_PER_GPU", "SLURM_NTASKS_PER_TRES")
# ...and, where tntrun is itself the task of a step (`srun -N1 -n1 tntrun`), that step's own
# distribution: srun sets SLURM_DISTRIBUTION=cyclic for a step of one task, and the ranks'
# srun read it: ranks 0 and 2 on hostA, 1 and 3 on hostB, not the blocks tntrun places
STEP_LAYOUT_VARIABLES = ("SLURM_DISTRIBUTION",)


def srun(srun_path, placement, rank_cmd, output_all, nodes_given, in_step=False):
    total = sum(n for _, n in placement)
    argv = [srun_path, f"--ntasks={total}"]
    per_node = uniform(placement)
    if per_node:
        argv.append(f"--ntasks-per-node={per_node}")
    argv.append(f"--nodes={len(placement)}")  # every node, also when -n spreads unevenly
    if nodes_given:
        argv.append("--nodelist=" + ",".join(h for h, _ in placement))
    # srun passes tntrun's whole environment on (--export=ALL is its default; made explicit).
    # --disable-status: one SIGINT is passed on to the tasks at once, which is how tntrun stops
    # srun (multi.py); its SIGTERM would SIGKILL them, without the grace period
    argv += ["--export=ALL", "--kill-on-bad-exit=1", "--disable-status"]
    if in_step:
        # tntrun is itself the task of a job step (`srun -N1 -n1 tntrun`, `srun --pty bash`),
        # which holds CPUs of the allocation: without --overlap (Slurm 20.11+) the ranks' step
        # waits for them for ever ("step creation temporarily disabled ... Requested nodes are busy")
        argv.append("--overlap")
    if output_all:
        argv.append("--label")
    return argv + rank_cmd


# srun's words when a step asks for more tasks than the allocation has CPUs (`salloc -N 1`
# holds one CPU under select/cons_tres, and `tntrun -n 2` asks srun for 2 tasks)
SRUN_TOO_FEW_CPUS = b"More processors requested than permitted"


def srun_too_few_cpus_advice(placement, environ):
    """The line tntrun adds under srun's SRUN_TOO_FEW_CPUS: what to change."""
    total, nodes = sum(n for _, n in placement), len(placement)
    per_node = uniform(placement)
    cpus = environ.get("SLURM_JOB_CPUS_PER_NODE")
    layout = f" or --ntasks-per-node={per_node}" if per_node and nodes > 1 else ""
    return (f"tntrun: srun needs a CPU of the allocation per rank, and it holds fewer than the {total} "
            f"rank(s) asked for" + (f" (SLURM_JOB_CPUS_PER_NODE={cpus})" if cpus else "") +
            f": allocate a task per rank (salloc -N {nodes} -n {total}{layout}, the same options for sbatch), "
            f"or run fewer ranks (tntrun -n)\n").encode()

def gaspi_machinefile(placement):
    # gaspi_run starts one rank per line, in order: rank r runs on line r
    return "".join(f"{h}\n" * n for h, n in placement)


def bootstrapped(rank_cmd):
    """The rank wrapper's command (`python -m tarantella.runner.rank ...`) run so that, where
    the wrapper cannot be imported on a host (Tarantella not installed for that Python there),
    the rank sends a record saying so, naming its rank and host (rank_report.bootstrap)."""
    if rank_cmd[1:3] == ["-m", "tarantella.runner.rank"]:
        return [rank_cmd[0], "-c", rank_report.bootstrap(), *rank_cmd[3:]]
    return rank_cmd


def bootstrapped_tail(argv, rank_cmd):
    """An engine's command `argv` (mpirun, mpiexec, srun), which ends in `rank_cmd`, with
    that command bootstrapped. Only the command run is: the one shown (--dry-run) keeps the
    readable `-m tarantella.runner.rank`, not the bootstrap's source."""
    assert argv[len(argv) - len(rank_cmd):] == rank_cmd, (argv, rank_cmd)
    return argv[:len(argv) - len(rank_cmd)] + bootstrapped(rank_cmd)


# gaspi_run's script exports its pid under this name, for the wrapper's --die-with-script
SCRIPT_PID = "TNT_RANK_SCRIPT_PID"


def gaspi_script(env, names, rank_cmd, cwd):
    lines = ["#!/bin/bash", "# generated by tntrun for gaspi_run, which forwards no environment",
             f"cd {shlex.quote(cwd)}"]
    for name in dict.fromkeys([*PASS_THROUGH, *names]):  # once each
        if name in env:
            lines.append(f"export {name}={shlex.quote(env[name])}")
    if rank_cmd[1:3] == ["-m", "tarantella.runner.rank"]:
        # no Python at that path on this host: the rank's record, at once (rank_report)
        lines.append(rank_report.shell_not_started(rank_cmd[0], env.get("TNT_JOB_ID", "")).rstrip("\n"))
    rank_cmd = bootstrapped(rank_cmd)
    # no "$@": the command is whole here, and gaspi_run passes its master rank one empty
    # argument when it has none ("$GPI2_PRG_ARGS"), which the program would receive.
    # No exec: gaspi_run stops a job with `killall -9 SCRIPT` on every host, which finds this
    # shell by the script's name (an exec'd wrapper is named python: nothing matched, and
    # through a real sshd the ranks of other hosts lived on); the wrapper, told its pid,
    # stops its program when the shell dies (rank.py --die-with-script)
    lines.append(f"export {SCRIPT_PID}=$$")
    lines.append(shlex.join(rank_cmd))
    return "\n".join(lines) + "\n"


def gaspi_ssh_shim(python, real_ssh, job_id, machinefile, lock):
    """The `ssh` put first on gaspi_run's PATH (see gaspi_ssh.py): gaspi_run never checks
    whether its ssh calls started the ranks, nor waits for them; this one tells tntrun when
    they did not start, and holds `lock` while they run."""
    return ("#!/bin/sh\n# generated by tntrun: gaspi_run's ssh, which reports a host it could not "
            "start ranks on\n"
            f"exec {shlex.join([python, '-m', 'tarantella.runner.gaspi_ssh', real_ssh, job_id, machinefile, lock])}"
            ' "$@"\n')


# in tntrun's private folder: the files gaspi_run's mktemp made, one path a line
ENGINE_TEMP_FILES = "engine-temp-files"


def gaspi_mktemp_shim(real_mktemp, listing):
    """The `mktemp` put first on gaspi_run's PATH: gaspi_run makes its machine files with
    mktemp (/tmp/.gpi2.XXXXXXXX) and removes them only when it ends by itself, not when it is
    stopped (tntrun stopping the job, SIGKILL after the grace period): one pair was left in
    /tmp by every stopped job. This one notes each file in `listing`, for tntrun (and
    tntrun --cleanup) to remove; the files stay where gaspi_run makes them (it copies one to
    the same path on a remote first host)."""
    return ("#!/bin/sh\n# generated by tntrun: gaspi_run's mktemp, which notes the files it makes "
            "for tntrun to remove\n"
            f'path=$({shlex.quote(real_mktemp)} "$@") || exit $?\n'
            f"printf '%s\\n' \"$path\" >> {shlex.quote(listing)}\n"
            "printf '%s\\n' \"$path\"\n")


def engine_temp_files(private_dir):
    """The files that gaspi_mktemp_shim noted in tntrun's private folder `private_dir`."""
    try:
        with open(os.path.join(private_dir, ENGINE_TEMP_FILES)) as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except OSError:
        return []


def gaspi_until_ranks_end(python, lock, machinefile, argv):
    """gaspi_run's command, run so that the job lasts until the ranks of every host have ended
    (gaspi_run itself ends with rank 0: gaspi_ssh.py)."""
    return [python, "-m", "tarantella.runner.gaspi_ssh", "--engine", lock, machinefile, *argv]


def gaspi(gaspi_run, placement, machinefile, script):
    total = sum(n for _, n in placement)
    return [*_bash_if_needed(gaspi_run), "-n", str(total), "-m", machinefile, script]


def _bash_if_needed(script):
    """GPI-2 1.6's gaspi_run says #!/bin/sh but is written for bash (`<<<`, `[[ =~ ]]`):
    where /bin/sh is another shell (Debian's dash) it fails with "Syntax error: redirection
    unexpected". Run such a script with bash."""
    try:
        with open(script, "rb") as f:
            first = f.readline()
    except OSError:
        return [script]
    bash = shutil.which("bash")
    if first.startswith(b"#!") and first.split()[0].endswith(b"/sh") and bash:
        return [bash, script]
    return [script]
