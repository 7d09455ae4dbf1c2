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


def tntrun(n, script, *args, env=None, timeout=300, runner_args=()):
    """Run `tntrun -n N -- script args` and return the CompletedProcess."""
    exe = shutil.which("tntrun")
    assert exe, "tntrun is not installed: pip install ."
    cmd = [exe, "-n", str(n), "--no-gpu", *runner_args, "--", os.path.join(HERE, script), *map(str, args)]
    return subprocess.run(cmd, env=clean_env(**(env or {})), capture_output=True, text=True, timeout=timeout)


def rank_reports(outdir, n, script, env=None):
    """Run `script OUTDIR` on n ranks with tntrun; each rank writes
    OUTDIR/rank<r>.json, returned in rank order."""
    res = tntrun(n, script, outdir, env=env)
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
