"""Helpers of the core tests: start real ranks with tntrun (or by hand, when a
test needs to watch every rank's own fate), with a clean environment."""
import json
import os
import secrets
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TNT_", "SLURM_", "OMPI_", "PMI_", "PMIX_"))}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def tntrun(n, script, *args, env=None, timeout=300, runner_args=(), **run_kw):
    """Run `tntrun -n N -- script args` and return the CompletedProcess (run_kw: more of
    subprocess.run's, e.g. preexec_fn)."""
    exe = shutil.which("tntrun")
    assert exe, "tntrun is not installed: pip install ."
    cmd = [exe, "-n", str(n), "--no-gpu", *runner_args, "--", os.path.join(HERE, script), *map(str, args)]
    return subprocess.run(cmd, env=clean_env(**(env or {})), capture_output=True, text=True, timeout=timeout,
                          **run_kw)


def _threads_of(pid):
    """One line per thread of process `pid`: its state, where it sleeps in the kernel and its
    CPU seconds (a thread spinning inside a library reads "R", no wait channel, seconds
    growing; one waiting for a peer reads "S futex_wait...")."""
    lines, tick = [], os.sysconf("SC_CLK_TCK")
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:  # it ended meanwhile
        return ["    (ended)"]
    for tid in tids:
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
            fields = stat[stat.rindex(")") + 2:].split()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            wchan = open(f"/proc/{pid}/task/{tid}/wchan").read().strip() or "-"
        except (OSError, ValueError):
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        lines.append(f"    thread {tid} ({name}): state {fields[0]}, wchan {wchan}, {cpu:.2f} s of CPU")
    return lines


def run_job(cmd, env, timeout):
    """subprocess.run(cmd) for a launcher of ranks (mpirun). On a timeout every process of the
    job still there (the launcher and its descendants: Open MPI puts each rank in a process
    group of its own) is listed with its threads, so that a hang is named, not only timed, and
    killed, so that no rank is left spinning through the rest of the suite; the test fails
    with that list."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import psutil  # the test extra's

        launcher = psutil.Process(proc.pid)
        job = [launcher] + launcher.children(recursive=True)
        report = [f"{' '.join(map(str, cmd))} did not end within {timeout} s; its processes then:"]
        for p in job:
            try:
                report.append(f"  pid {p.pid}: {' '.join(p.cmdline())[-160:]}")
            except psutil.Error:
                continue
            report += _threads_of(p.pid)
        for p in job:
            try:
                p.kill()
            except psutil.Error:
                pass
        out, err = proc.communicate()
        raise AssertionError("\n".join(report) + "\n--- stdout\n" + out[-3000:] + "\n--- stderr\n" + err[-3000:])
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def rank_reports(outdir, n, script, env=None, **run_kw):
    """Run `script OUTDIR` on n ranks with tntrun; each rank writes
    OUTDIR/rank<r>.json, returned in rank order."""
    res = tntrun(n, script, outdir, env=env, **run_kw)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [json.load(open(os.path.join(outdir, f"rank{r}.json"))) for r in range(n)]


def spawn_ranks(n, script, *args, env=None):
    """Start n ranks directly (no launcher supervision), so that a test can see
    what each surviving rank does after a peer dies. Returns (job_id, procs)."""
    job = secrets.token_hex(16)
    procs = []
    for r in range(n):
        e = clean_env(TNT_RANK=r, TNT_SIZE=n, TNT_LOCAL_RANK=r, TNT_LOCAL_SIZE=n, TNT_JOB_ID=job,
                      **(env or {}))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, script), *map(str, args)], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return job, procs


def shm_objects(job=None):
    """Names in /dev/shm that belong to Tarantella jobs (of `job` if given)."""
    prefix = f"tnt-{job}" if job else "tnt-"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def json_lines(text):
    """The JSON objects the ranks printed (mpirun may join two ranks' lines)."""
    decoder, found = json.JSONDecoder(), []
    for line in text.splitlines():
        at = line.find("{")
        while at >= 0:
            try:
                obj, end = decoder.raw_decode(line, at)
            except ValueError:
                at = line.find("{", at + 1)
                continue
            found.append(obj)
            at = line.find("{", end)
    return found


def collectives_agree(reports):
    """The reports of rank_collectives.py, one per rank in rank order: no rank
    found a wrong result, and every rank has rank 0's digest of every result.
    Returns rank 0's results, for comparisons with other runs (same_results)."""
    for rep in reports:
        assert rep["failures"] == [], (rep["rank"], rep["failures"])
    first = reports[0]["results"]
    assert len(first) > 100  # every dtype x size x collective produced a digest
    for rep in reports[1:]:
        differing = [k for k in first if rep["results"].get(k) != first[k]]
        assert not differing, f"rank {rep['rank']} differs from rank 0 on {differing[:5]}"
    return first


def same_results(first, other, what):
    """Two runs' digests of every result are equal (`what`: which runs, for the message).
    Not those of sums of NaNs ("nan-bits-..."): which of two NaNs a sum keeps follows the
    machine code of the algorithm that added them, which the runs may choose apart (another
    transport, TNT_SHM_DIRECT); every rank of a run keeps the same one (collectives_agree)."""
    differing = [k for k in first if not k.startswith("nan-bits-") and other.get(k) != first[k]]
    assert not differing, f"{what} differ on {len(differing)} results: {differing[:5]}"
