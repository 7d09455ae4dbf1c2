"""Usage errors (exit code 2 with a message saying what to do), --help and --version."""
import platform
import re

import pytest
from tntrun_helpers import TARANTELLA, run_tntrun, start_tntrun


def test_help_is_grouped_and_has_examples():
    res = run_tntrun(["--help"])
    assert res.returncode == 0
    for group in ("Single-node execution", "Multi-node execution", "Performance tuning", "Cleanup",
                  "Logging and output", "examples:"):
        assert group in res.stdout
    for flag in ("--no-gpus", "--devices-per-node", "--npernode", "--pin-memory-to-socket",
                 "--python-interpreter", "--dry-run", "--fusion-threshold", "--timeline"):
        assert flag in res.stdout
    # the core's defaults, filled in only for the help (reading them loads the core)
    text = " ".join(res.stdout.split())
    assert "<TNT_" not in text and re.search(r"TNT_TIMEOUT_S; default \d+\)", text), res.stdout
    # where the environment variables are listed: the help said "see `tntrun --help`", itself
    assert "environment variables (TNT_*): docs/environment.md" in text
    assert re.search(r"TNT_FUSION_THRESHOLD_KB; default \d+\)", text), res.stdout


def test_version():
    res = run_tntrun(["--version"])
    assert res.returncode == 0 and res.stdout.startswith("Tarantella ")


def test_version_read_in_part_ends_quietly():
    # `tntrun --version | head -1`: the reader closes the pipe after one line
    proc = start_tntrun(["--version"])
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0 and first.startswith("Tarantella ")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("args, message", [
    (["--bogus", "--", "x.py"], "unrecognized arguments: --bogus"),
    # the original Tarantella's launcher took prefixes of its flags; here the error names the flags
    (["--fusion-thresh", "64", "--", "x.py"],
     "--fusion-thresh: did you mean --fusion-threshold or --fusion-threshold-mb? Flags are spelled out in full."),
    (["--verbos", "--", "x.py"], "--verbos: did you mean --verbose?"),
    (["-n", "2"], "missing PROGRAM"),
    (["-n", "2", "--"], "missing PROGRAM"),
    (["-n", "0", "--", "x.py"], "must be at least 1. Received: 0"),
    (["-n", "two", "--", "x.py"], "expected a whole number"),
    (["--force", "--", "x.py"], "--force only goes with --cleanup"),
    (["--log-level", "LOUD", "--", "x.py"], "choose from DEBUG, INFO, WARNING, ERROR"),
    (["--transport", "tcp", "--", "x.py"], "invalid choice: 'tcp'"),
    (["--fusion-threshold", "-1", "--", "x.py"], "must be 0 or more"),
    (["--timeout", "0", "--", "x.py"], "must be more than 0"),
    (["-x", "1BAD=v", "--", "x.py"], "-x expects NAME=VALUE"),
    (["-x", "TNT_SURELY_UNSET_VAR", "--", "x.py"], "is not set in this environment"),
    (["-x", "TNT_JOB_ID=mine", "--", "x.py"], "tntrun sets TNT_JOB_ID itself"),
    (["-x", "TNT_RANK=1", "--", "x.py"], "tntrun sets TNT_RANK itself"),
    (["--max-restarts", "3", "--", "x.py"], "restarts are not supported"),
    (["--n-per-node", "2", "-n", "3", "--", "x.py"],
     "-n 3 and --n-per-node 2 (2 ranks on this host) disagree: give one of them"),
    (["--no-python", "--python-interpreter", "python", "--", "x.py"], "contradict"),
    (["-m", "--no-python", "--", "json.tool"], "-m/--module runs PROGRAM as `python -m PROGRAM`"),
    # an empty host list (an unset variable) ran the job on this host alone, without a word
    # (each message's example is its own flag's: the --hostfile one spoke of -H "$HOSTS")
    (["-H", "", "--", "x.py"], '-H/--hosts is empty (an unset variable, as in -H "$HOSTS"?)'),
    (["--hostfile", " ", "--", "x.py"],
     '--hostfile is empty (an unset variable, as in --hostfile "$HOSTFILE"?)'),
    # commas alone: the hint spoke of lines, which -H has none of
    (["-H", ",", "--", "x.py"], "--hosts: no host listed (write host names separated by commas: -H h1:2,h2:2)"),
])
def test_usage_errors(args, message):
    res = run_tntrun(args)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert "usage: tntrun" in res.stderr


def test_bad_hostfile_names_the_line(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# cluster\nnode1\n\nnode2 slots=2\nnode1:4\n")
    res = run_tntrun(["--hostfile", str(hosts), "--dry-run", "--", "x.py"])
    assert res.returncode == 2
    assert f"{hosts}:5: host 'node1' is listed twice (first at {hosts}:2)" in res.stderr


def test_empty_hostfile(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# nothing here\n\n")
    res = run_tntrun(["--hostfile", str(hosts), "--", "x.py"])
    assert res.returncode == 2 and "no host listed" in res.stderr


def test_unreadable_hostfile_line(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\nnode2 slots=two\n")
    res = run_tntrun(["--hostfile", str(hosts), "--", "x.py"])
    assert res.returncode == 2 and f"{hosts}:2: cannot read 'node2 slots=two'" in res.stderr


def test_missing_hostfile(tmp_path):
    res = run_tntrun(["--hostfile", str(tmp_path / "none"), "--", "x.py"])
    assert res.returncode == 2 and "cannot read it" in res.stderr


def test_tarantella_refuses_n_beside_several_hosts(tmp_path):
    # The original `tarantella --hostfile hosts -n 2` started 2 ranks on each host (4 on two
    # nodes); read as the total it ran 2 ranks, one per host, without a word
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\nnode2\n")
    res = run_tntrun(["--hostfile", str(hosts), "-n", "2", "--dry-run", "--", "x.py"],
                     command=TARANTELLA)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "usage: tarantella" in res.stderr
    assert "the original tarantella started -n ranks on each host (2 x 2 = 4)" in res.stderr
    assert "Write --n-per-node 2 for 2 ranks on each host" in res.stderr
    # the original's meaning, written as both commands read it
    res = run_tntrun(["--hostfile", str(hosts), "--n-per-node", "2", "--dry-run", "--", "x.py"],
                     command=TARANTELLA)
    assert res.returncode == 0 and "4 rank(s) on node1:2, node2:2" in res.stdout, res.stderr
    # tntrun reads -n as the total (cli.md), as mpirun does
    res = run_tntrun(["--hostfile", str(hosts), "-n", "2", "--dry-run", "--", "x.py"])
    assert res.returncode == 0 and "2 rank(s) on node1:1, node2:1" in res.stdout, res.stderr
    # one host: both readings agree, nothing to refuse
    hosts.write_text("node1\n")
    res = run_tntrun(["--hostfile", str(hosts), "--n-per-node", "1", "-n", "1", "--dry-run", "--",
                      "x.py"], command=TARANTELLA)
    assert res.returncode == 0, res.stderr
    # and -n alone on one host without slots is its ranks there, as the original ran it (it
    # was refused: "-n 4 does not match the host list: 1 host(s) with 1 rank(s) each")
    for command in (TARANTELLA, None):
        res = run_tntrun(["--hostfile", str(hosts), "-n", "4", "--dry-run", "--", "x.py"],
                         command=command)
        assert res.returncode == 0 and "4 rank(s) on node1:4" in res.stdout, res.stderr
    # slots written in the file still rule: -n must agree with them
    hosts.write_text("node1 slots=2\n")
    res = run_tntrun(["--hostfile", str(hosts), "-n", "4", "--dry-run", "--", "x.py"])
    assert res.returncode == 2 and "-n 4 does not match the host list" in res.stderr, res.stderr


def test_cleanup_with_a_host_list_says_it_acts_on_this_host_only(tmp_path):
    # the original `tarantella --hostfile hosts --cleanup -- model.py` cleaned up every host of
    # the list; the list was taken without a word, and only this host was cleaned
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{platform.node()}\nnode-elsewhere1\nnode-elsewhere2\n")
    res = run_tntrun(["--hostfile", str(hosts), "--cleanup", "--", "x.py"], command=TARANTELLA)
    assert res.returncode == 0, res.stderr
    assert ("--cleanup acts on this host only: it does not reach node-elsewhere1, node-elsewhere2 "
            "of the host list") in res.stderr and "run `tntrun --cleanup -- PROGRAM` on each" in res.stderr
    assert "nothing to do" in res.stdout + res.stderr  # this host's clean-up still ran
    res = run_tntrun(["-H", f"localhost:2,{platform.node()}:2", "--cleanup", "--", "x.py"])
    assert res.returncode == 0 and "WARNING" not in res.stderr, res.stderr


def test_ranks_per_node_without_hosts_are_the_ranks_of_this_host():
    # torchrun's spelling, both ways, runs that many ranks here (it was refused as "for several
    # hosts", and --nproc_per_node first got a hint to write --nproc-per-node)
    for flag in ("--nproc_per_node", "--nproc-per-node", "--n-per-node", "-ppn"):
        res = run_tntrun([flag, "3", "--dry-run", "--", "x.py"])
        assert res.returncode == 0 and "3 rank(s) on" in res.stdout, (flag, res.stdout, res.stderr)
        assert "TNT_RANK=2 TNT_SIZE=3" in res.stdout, res.stdout
    res = run_tntrun(["--n-per-node", "2", "-n", "2", "--dry-run", "--", "x.py"])  # agreeing: fine
    assert res.returncode == 0 and "2 rank(s) on" in res.stdout, res.stderr


def test_n_must_match_the_hostfile(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\n")
    res = run_tntrun(["--hostfile", str(hosts), "--n-per-node", "2", "-n", "2", "--dry-run", "--", "x.py"])
    assert res.returncode == 2
    assert "2 host(s) with 2 rank(s) each make 4 ranks in total" in res.stderr
