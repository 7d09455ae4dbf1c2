"""Local jobs: ranks started by tntrun itself, their environment, output and failure."""
import glob
import os
import re

from tntrun_helpers import run_tntrun


def test_ranks_get_the_environment_contract(script):
    path = script("""
        keys = ["TNT_RANK", "TNT_SIZE", "TNT_LOCAL_RANK", "TNT_LOCAL_SIZE", "TNT_JOB_ID",
                "TNT_ERROR_FILE", "PYTHONUNBUFFERED"]
        print("ENV", " ".join(f"{k}={os.environ.get(k)}" for k in keys), sys.argv[1:], flush=True)
    """)
    res = run_tntrun(["-n", "3", "--output-on-all-devices", "--", path, "a", "--b=1"])
    assert res.returncode == 0, res.stderr
    lines = sorted(ln for ln in res.stdout.splitlines() if " ENV " in ln)
    assert len(lines) == 3
    job_ids = set()
    for r, line in enumerate(lines):
        assert line.startswith(f"[{r}] ENV TNT_RANK={r} TNT_SIZE=3 TNT_LOCAL_RANK={r} TNT_LOCAL_SIZE=3")
        assert "PYTHONUNBUFFERED=1" in line and "['a', '--b=1']" in line
        job_ids.add(re.search(r"TNT_JOB_ID=(\w+)", line).group(1))
        assert re.search(r"TNT_ERROR_FILE=/\S+rank%d\.json" % r, line)
    (job_id,) = job_ids
    assert re.fullmatch(r"[0-9a-f]{32}", job_id)


def test_failing_rank_ends_the_job_with_its_code(script):
    path = script("""
        if os.environ["TNT_RANK"] == "1":
            print("something broke on rank 1", file=sys.stderr)
            sys.exit(7)
        time.sleep(60)
    """)
    res = run_tntrun(["-n", "3", "--", path], timeout=30)
    assert res.returncode == 7
    assert "Root cause" in res.stderr and "1 (local_rank 1)" in res.stderr
    assert "exit code 7" in res.stderr
    assert "something broke on rank 1" in res.stderr  # hidden rank's stderr shown in the report


def test_shm_of_the_job_is_removed(script):
    path = script("""
        job = os.environ["TNT_JOB_ID"]
        with open(f"/dev/shm/tnt-{job}-rank{os.environ['TNT_RANK']}", "w") as f:
            f.write("x")
        print("JOB", job)
    """)
    res = run_tntrun(["-n", "2", "--", path])
    assert res.returncode == 0, res.stderr
    job = re.search(r"JOB (\w+)", res.stdout).group(1)
    assert glob.glob(f"/dev/shm/tnt-{job}*") == []
