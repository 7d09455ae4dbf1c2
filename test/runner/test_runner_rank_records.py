"""Across hosts, a failed rank's record (rank, host, exit status, error, stderr tail) travels
from the rank wrapper on its host through the engine's stderr to tntrun: the wrapper's
supervision of the program, the record's encoding through engines' line prefixes and any
chunking, and the choice of the root cause among the ranks' records."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from tntrun_helpers import import_runner, rank_wrapper_argv, runner_env

import_runner()
from tarantella.runner import multi, rank_report, report  # noqa: E402
from tarantella.runner.supervise import JobResult, ProcResult, ProcSpec  # noqa: E402

JOB = "0123456789abcdef" * 2


def _records(stream, job=JOB):
    """(the text the user sees, the records) of an engine's stderr, fed in pieces of 7 bytes."""
    collector = rank_report.Collector(job)
    filt = rank_report.MarkerFilter(collector)
    shown = b"".join(filt.feed(stream[i:i + 7]) for i in range(0, len(stream), 7)) + filt.flush()
    return shown, collector.records


def test_records_cross_engine_prefixes_and_chunks():
    big = {"rank": 3, "host": "hostB", "stderr_tail": os.urandom(3000).hex() + "\u00e9", "returncode": -9}
    small = {"rank": 1, "host": "hostA", "returncode": 2}
    lines = rank_report.encode(big, JOB)
    assert len(lines) > 1 and all(len(line) < 700 for line in lines)
    stream = b"plain line\n"
    for line in lines:  # mpirun --tag-output and srun --label prefixes, interleaved ranks
        stream += b"[1,3]<stderr>:" + line + b"1: other rank's line\n"
    stream += b"2: " + rank_report.encode(small, JOB)[0]
    stream += rank_report.encode(small, "f" * 32)[0]  # another job's record stays text
    stream += b"a progress bar\r without newline"
    shown, records = _records(stream)
    assert sorted(records, key=lambda r: r["rank"]) == [small, big]
    assert shown.count(b"1: other rank's line\n") == len(lines)
    assert shown.startswith(b"plain line\n") and shown.endswith(b"a progress bar\r without newline")
    assert b"tntrun-rank-report " + b"f" * 12 in shown
    assert b"tntrun-rank-report " + JOB[:12].encode() not in shown


def test_a_chunk_of_many_lines_is_filtered_in_linear_time():
    # the filter of an engine's output sliced each line off the rest of its chunk, copying
    # the rest: time quadratic in a chunk's lines (4 MiB of short lines in one piece: about a
    # minute here; now well under a second, far inside the bound below)
    collector = rank_report.Collector(JOB)
    filt = rank_report.MarkerFilter(collector)
    stream = b"ab\n" * ((4 << 20) // 3) + rank_report.encode({"rank": 5}, JOB)[0] + b"tail"
    started = time.monotonic()
    shown = filt.feed(stream) + filt.flush()
    assert time.monotonic() - started < 20
    assert shown == b"ab\n" * ((4 << 20) // 3) + b"tail" and collector.records == [{"rank": 5}]


def test_partial_lines_are_shown_at_once():
    collector = rank_report.Collector(JOB)
    filt = rank_report.MarkerFilter(collector)
    assert filt.feed(b"Epoch 1/3 [===") == b"Epoch 1/3 [==="  # not held until a newline
    assert filt.feed(b"===]\r") == b"===]\r"
    # a record after a line that was shown in part: that line is ended, the record taken
    assert filt.feed(b"half") == b"half"
    assert filt.feed(rank_report.encode({"rank": 0}, JOB)[0]) == b"\n"
    assert collector.records == [{"rank": 0}]


def _wrapper(program, rank=1, extra_env=None, **kwargs):
    env = runner_env(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="4",
                     OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE="2",
                     TNT_JOB_ID=JOB, **(extra_env or {}))
    argv = rank_wrapper_argv() + ["--report", "--size=4", "--", sys.executable, "-c", program]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            **kwargs)


def test_wrapper_reports_a_failure_and_exits_like_the_program():
    program = ("import os, sys; print(os.environ['TNT_RANK'], os.environ['TNT_LOCAL_RANK'], "
               "os.environ['TNT_LOCAL_SIZE'], flush=True); "
               "sys.stderr.write('line one\\nno newline at the end'); sys.exit(3)")
    proc = _wrapper(program, rank=0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert out == b"0 0 2\n"  # rank 0's stdout is shown
    shown, records = _records(err)
    assert shown == b"line one\nno newline at the end\n"  # passed through, then ended
    [record] = records
    assert record["rank"] == 0 and record["local_rank"] == 0 and record["size"] == 4
    assert record["host"] == socket.gethostname() and record["returncode"] == 3
    assert record["stopped"] is False and record["stderr_tail"] == "line one\nno newline at the end"


def test_wrapper_forwards_the_error_file_and_hides_other_ranks_stdout():
    program = ("import json, os, sys; print('hidden'); "
               "json.dump({'message': 'ValueError: on rank 1', 'traceback': 'Traceback ...', "
               "'timestamp': 5.0}, open(os.environ['TNT_ERROR_FILE'], 'w')); "
               "print(os.environ['TNT_ERROR_FILE'], file=sys.stderr); sys.exit(1)")
    proc = _wrapper(program, rank=1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out == b""
    shown, [record] = _records(err)
    assert record["error"]["message"] == "ValueError: on rank 1"
    error_file = shown.decode().strip()
    assert not os.path.exists(os.path.dirname(error_file))  # the private folder is removed


def test_wrapper_dies_by_the_programs_signal(tmp_path):
    # the wrapper's private folder (TNT_ERROR_FILE's) goes before the wrapper ends by the
    # program's signal: it was left in the temporary directory of every host
    proc = _wrapper("import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                    extra_env={"TMPDIR": str(tmp_path)})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    _, [record] = _records(err)
    assert record["returncode"] == -signal.SIGKILL and record["stopped"] is False
    assert os.listdir(tmp_path) == []


def test_wrapper_passes_a_stop_on_and_marks_the_rank_stopped(tmp_path):
    proc = _wrapper("import sys, time; print('up', file=sys.stderr, flush=True); time.sleep(120)",
                    extra_env={"TMPDIR": str(tmp_path)})
    assert proc.stderr.readline() == b"up\n"
    proc.send_signal(signal.SIGTERM)  # what mpirun and srun send after another rank failed
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    _, [record] = _records(err)
    assert record["returncode"] == -signal.SIGTERM and record["stopped"] is True
    assert os.listdir(tmp_path) == []  # no tnt-rank-* folder left behind


def test_wrapper_success_sends_its_end_and_each_init_it_began():
    # a success sends its end too, with how many tnt.init() calls the program began (each one
    # noted at once as it begins, in the wrapper's named pipe): tntrun learns from them that
    # ranks wait in tnt.init() for one that ended without joining (multi.Joins)
    program = ("import sys; from tarantella.common import core; core._note_joining(); "
               "sys.stderr.write('half a line'); sys.stderr.flush(); core._note_joining(); "
               "sys.stderr.write(' ended\\nfine\\n')")
    proc = _wrapper(program)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    collector = rank_report.Collector(JOB)
    notes = []
    collector.on_record = notes.append
    filt = rank_report.MarkerFilter(collector)
    shown = filt.feed(err) + filt.flush()
    # a note that came in the middle of a line of the program's starts a line of its own
    assert shown in (b"half a line ended\nfine\n", b"half a line\n ended\nfine\n"), shown
    assert [(n.get("note"), n["joins"]) for n in notes] == [("joining", 1), ("joining", 2), (None, 2)]
    [end] = collector.records  # the notes are not ends
    assert end["returncode"] == 0 and end["stderr_tail"].endswith("fine") and end["stopped"] is False
    engine = ProcResult(ProcSpec(argv=["mpirun"], env={}, label="mpirun", host="login1"), 99, returncode=0)
    assert multi.ranks_job(JobResult(results=[engine]), [end], "mpirun", multi.Joins()).root_cause is None


def _note(rank, joins, host="hostA"):
    return {"rank": rank, "host": host, "note": "joining", "joins": joins}


def _end(rank, joins, host="hostB", code=0, **extra):
    return dict({"rank": rank, "local_rank": 0, "host": host, "pid": 70 + rank, "returncode": code, "ended_at": 5.0,
                 "stopped": False, "error": None, "joins": joins, "stderr_tail": f"rank {rank} had no shard"},
                **extra)


@pytest.mark.parametrize("order", ["end first", "note first"])
def test_a_rank_that_ended_without_joining_while_others_wait_is_the_root_cause(order):
    # across hosts no one told the ranks waiting in tnt.init() (MPI_Init, gaspi_proc_init) that
    # rank 1 had ended without joining: they waited until TNT_TIMEOUT_S. tntrun, which hears of
    # both, ends the job at once, whichever it hears of first, and names rank 1
    joins = multi.Joins()
    events = [_end(1, 0), _note(0, 1)]
    found = [joins.take(record, "mpirun") for record in (events if order == "end first" else events[::-1])]
    assert found[0] is None and found[1] is joins.found
    assert found[1]["rank"] == 1 and found[1]["waiting"] == 0
    assert joins.take(_note(2, 1), "mpirun") is None  # said once
    job = multi.ranks_job(JobResult(results=[ProcResult(ProcSpec(argv=["mpirun"], env={}, label="mpirun",
                                                                 host="hostA"), 99, returncode=-15, stopped=True)],
                                    stalled=found[1]["reason"]),
                          [_end(1, 0), {"rank": 0, "host": "hostA", "returncode": -15, "ended_at": 6.0,
                                        "stopped": True, "stopped_at": 5.5}], "mpirun", joins)
    assert job.root_cause.spec.rank == 1 and job.exit_code == 1
    text = report.format_failure(job, "train.py")
    root = text.split("Root cause")[1].split("-" * 72)[0]
    assert root.startswith(" (first failure not caused by another rank):\n  rank:    1 (local_rank 0)\n  host:    hostB\n  pid:     71\n  exit:    exit code 0\n"), text
    assert ("error:   rank 1 ended (exit code 0) before it joined the job, while rank 0 on hostA waited for it in "
            "tnt.init()") in root, text
    assert "rank 1 had no shard" in root, text  # its stderr's tail
    assert "tntrun stopped mpirun: rank 1 ended on hostB (exit code 0) without joining the job, while rank 0 " \
           "waits for it in tnt.init()" in text, text


def test_ends_that_leave_no_one_waiting_are_no_failure():
    joins = multi.Joins()
    # every rank joined once and ended: the usual end of a job, in any order
    assert [joins.take(r, "srun") for r in (_note(0, 1), _note(1, 1), _end(1, 1), _end(0, 1))] == [None] * 4
    # no rank uses Tarantella (a probe, `hostname`): none joins
    joins = multi.Joins()
    assert [joins.take(r, "srun") for r in (_end(0, 0), _end(1, 0))] == [None, None]
    # a failure, a stop, an exit 0 after a caught collective error, a wrapper that does not count
    # joins (another release): each is reported as such, not as an early end
    for end in (_end(1, 0, code=3), _end(1, 0, stopped=True), _end(1, 0, error={"caught": True}),
                {k: v for k, v in _end(1, 0).items() if k != "joins"}):
        joins = multi.Joins()
        assert joins.take(_note(0, 1), "srun") is None and joins.take(end, "srun") is None, end
    # a rank that ended after one init while another begins a second one waits for it in vain
    joins = multi.Joins()
    for record in (_note(0, 1), _note(1, 1), _end(1, 1)):
        assert joins.take(record, "gaspi_run") is None
    found = joins.take(_note(0, 2), "gaspi_run")
    assert found["rank"] == 1 and "rank 1 ended (exit code 0) after 1 tnt.init() call, where rank 0 began 2" \
        in found["message"], found


def test_a_rank_stopped_in_its_exit_after_shutting_down_is_shown_with_its_stderr():
    # across hosts the rank that ended early (one allreduce less) waits at exit in MPI_Finalize
    # for the others, which fail naming it; mpirun stops it there. Its record (stopped, no error
    # of its own) is shown below the root cause, as on one host a rank that ended, exit code 0
    records = [{"rank": 0, "host": "hostA", "returncode": 1, "ended_at": 10.1, "stopped": False,
                "error": {"message": "PeerLostError: rank 1 has shut down while rank 0 was in a bit round of the "
                                     "negotiation", "timestamp": 10.0, "caused_by_rank": 1}},
               _end(1, 1, code=-15, stopped=True, stopped_at=10.5, stderr_tail="left the loop early")]
    text = report.format_failure(multi.ranks_job(_engine_job(code=1), records, "mpirun"), "train.py")
    assert ("Rank 1 (hostB, pid 71) had shut down (its process, still in its exit, was then stopped by mpirun: "
            "signal 15 (SIGTERM)) while the others still made collective calls") in text, text
    assert "left the loop early" in text.split("had shut down")[1], text


def test_a_rank_that_went_on_after_a_failed_collective_fails_the_job():
    # the program caught a PeerLostError (or Python ignored it in an atexit handler) and
    # exited 0, and so did the engine: tarantella wrote the error at exit, marked "caught".
    # The wrapper still exits 0, as the program did, but sends the record, and tntrun
    # counts the job as failed: it exited 0 before
    program = ("import json, os; json.dump({'message': 'PeerLostError: rank 0 has shut down while rank 1 "
               "was ...', 'timestamp': 5.0, 'caused_by_rank': 0, 'caught': True}, "
               "open(os.environ['TNT_ERROR_FILE'], 'w'))")
    proc = _wrapper(program, rank=1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    _, [record] = _records(err)
    assert record["returncode"] == 0 and record["error"]["caught"] is True
    engine = ProcResult(ProcSpec(argv=["mpirun"], env={}, label="mpirun", host="login1"), 99, returncode=0)
    job = multi.ranks_job(JobResult(results=[engine]), [dict(record, host="n2")], "mpirun")
    assert job.root_cause.spec.rank == 1 and job.exit_code == 1
    text = report.format_failure(job, "train.py")
    assert "exit code 0" in text and "the program went on after this error" in text, text
    assert report.format_one_line(job) == \
        "tntrun: error: n2: rank 1: Exit code 0 after a collective failed (PeerLostError, caught)"


def _engine_job(code=143):
    spec = ProcSpec(argv=["srun"], env={}, label="srun", host="login1")
    engine = ProcResult(spec, 99, returncode=code, ended_at=time.time())
    return JobResult(results=[engine], root_cause=engine)


def test_root_cause_is_the_rank_not_the_engine():
    records = [
        {"rank": 0, "host": "n1", "returncode": -15, "ended_at": 12.0, "stopped": True,
         "stopped_at": 11.5},
        {"rank": 3, "host": "n2", "returncode": 1, "ended_at": 11.0, "stopped": False,
         "error": {"message": "PeerLostError: rank 2 aborted", "timestamp": 10.5}},
        {"rank": 2, "host": "n2", "returncode": 7, "ended_at": 11.2, "stopped": False,
         "stderr_tail": "the real reason", "error": None},
    ]
    job = multi.ranks_job(_engine_job(), records, "srun")
    assert job.root_cause.spec.rank == 2 and job.root_cause.spec.host == "n2"
    assert job.exit_code == 7  # the rank's own status, not srun's 143
    text = report.format_failure(job, "train.py")
    root = text.split("Root cause")[1].split("-" * 72)[0]
    assert "rank:    2" in root and "host:    n2" in root and "the real reason" in root
    assert "Stopped by srun after the failure: 0" in text
    assert "srun (on login1, pid 99) ended with exit code 143" in text
    assert report.format_one_line(job) == "tntrun: error: n2: rank 2: Exit code 7"


def test_a_rank_stopped_in_its_shutdown_after_finishing_is_not_the_root_cause():
    # rank 3 (hostB) finished its program one allreduce early; the others' last allreduce
    # fails naming it, and mpirun SIGTERMs it while its shutdown still runs. It did not fail:
    # as on one host, the root cause is the first rank that did (and tntrun exits with its
    # status), and rank 3 is listed as stopped, not as the root cause "killed by SIGTERM"
    def lost(rank, at, text):
        return {"rank": rank, "host": "hostA" if rank < 2 else "hostB", "returncode": 1, "ended_at": at + 0.1,
                "stopped": False, "error": {"message": f"PeerLostError: {text}", "timestamp": at,
                                            "caused_by_rank": 3}}
    records = [
        lost(1, 10.2, "rank 3 has shut down while rank 1 was in a bit round of the negotiation"),
        lost(0, 10.1, "rank 3 has shut down while rank 0 was in a bit round of the negotiation"),
        lost(2, 10.3, "rank 0 aborted because of rank 3 (rank 3 has shut down while rank 0 was in a bit "
                      "round of the negotiation) while rank 2 was in a bit round of the negotiation"),
        {"rank": 3, "host": "hostB", "returncode": -15, "ended_at": 10.6, "stopped": True, "stopped_at": 10.5},
    ]
    job = multi.ranks_job(_engine_job(code=1), records, "mpirun")
    assert job.root_cause.spec.rank == 0 and job.exit_code == 1
    assert "Stopped by mpirun after the failure: 3" in report.format_failure(job, "train.py")
    # a rank the others found stuck (a TimeoutError) and that had to be stopped stays the cause
    stuck = [dict(records[0], error={"message": "TimeoutError: rank 1 timed out waiting for data from rank 3: "
                                                "rank 3 (pid 7) is stopped", "timestamp": 10.2,
                                     "caused_by_rank": 3}), records[3]]
    assert multi.ranks_job(_engine_job(code=1), stuck, "mpirun").root_cause.spec.rank == 3


def test_a_rank_that_was_never_started_says_so():
    # gaspi_run's ssh could not reach a host (gaspi_ssh.py), or the wrapper could not start the
    # program: the record has no pid, and the report said "pid:     None"
    records = [{"rank": 1, "local_rank": 0, "host": "nohost", "pid": None, "returncode": 255,
                "ended_at": 3.0, "stopped": False, "not_started": True,
                "error": {"message": "NotStartedError: ssh could not reach nohost", "timestamp": 3.0}},
               {"rank": 2, "local_rank": 0, "host": "hostB", "pid": None, "returncode": 127,
                "ended_at": 3.5, "stopped": False, "stderr_tail": "cannot start 'nothere.py'"}]
    text = report.format_failure(multi.ranks_job(_engine_job(code=1), records, "gaspi_run"), "train.py")
    root = text.split("Root cause")[1].split("-" * 72)[0]
    assert "  rank:    1 (local_rank 0)\n  host:    nohost\n  pid:     not started\n" in root, text
    other = text.split("Other failures:")[1]
    assert "  host:    hostB\n  pid:     not started\n" in other, text
    assert "None" not in text, text

def test_without_records_the_engine_stays_the_root_cause():
    job = _engine_job(code=255)
    assert multi.ranks_job(job, [], "mpirun") is job
    # only ranks the engine stopped: nothing of their own to report
    stopped = [{"rank": 0, "host": "n1", "returncode": -15, "ended_at": 2.0, "stopped": True,
                "stopped_at": 1.0}]
    assert multi.ranks_job(job, stopped, "mpirun") is job


@pytest.mark.parametrize("stream", ["stderr", "stdout"])
def test_an_engine_that_does_not_end_the_job_is_stopped(tmp_path, stream, capfd):
    # an engine whose rank 3 failed on hostB but which goes on (mpirun waiting for a daemon
    # beyond a cut link), with a child in a process group of its own (as Open MPI's ssh
    # children are): tntrun stops both, names rank 3 and says why. The record comes on
    # stderr (mpirun, srun) or stdout (gaspi_run's remote ranks)
    from tarantella.runner import local

    fd = 2 if stream == "stderr" else 1
    child_pid = tmp_path / "child"
    engine = ("import os, subprocess, sys, time\n"
              "from tarantella.runner import rank_report\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)'], start_new_session=True)\n"
              f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
              f"rank_report.write({{'rank': 3, 'host': 'hostB', 'returncode': -9, 'ended_at': time.time()}}, {JOB!r}, fd={fd})\n"
              "time.sleep(100)\n")
    collector = rank_report.Collector(JOB)
    spec = ProcSpec(argv=[sys.executable, "-c", engine], env=runner_env(), label="mpirun", host="hostA",
                    stderr_filter=rank_report.MarkerFilter(collector),
                    stdout_filter=rank_report.MarkerFilter(collector))
    code = local.run([spec], JOB, "train.py", ["train.py"], watch=multi.stall_watch(collector, "mpirun", 1.0),
                     translate=lambda job: multi.ranks_job(job, collector.records, "mpirun"))
    err = capfd.readouterr().err
    assert code == 128 + 9, err
    assert "tntrun: rank 3 failed on hostB and mpirun had not ended the job 1 s later: stopping it" in err
    root = err.split("Root cause")[1].split("-" * 72)[0]
    assert "rank:    3" in root and "host:    hostB" in root
    assert "tntrun stopped mpirun: rank 3 failed on hostB" in err
    pid = int(child_pid.read_text())
    for _ in range(50):  # SIGKILLed: gone (reaped by init) at once
        if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the engine's child {pid} outlived it")


def test_gaspi_runs_clean_up_stops_the_ranks_it_names(tmp_path):
    # gaspi_run stops a job with `killall -9 .tnt-<job>.sh` on every host. The script exec'd the
    # wrapper (named python), so nothing matched: through a real sshd the ranks of other hosts
    # lived on until their next collective. The script now stays, under its own name, and the
    # wrapper stops its program (SIGTERM, its grace) when the script dies, removing its folder
    from tarantella.runner import engines

    name = ".tnt-0123456789ab.sh"
    log = tmp_path / "log"
    program = (f"import os, signal, sys, time\n"
               f"def stop(*_):\n    open({str(log)!r}, 'a').write('SIGTERM\\n'); sys.exit(0)\n"
               f"signal.signal(signal.SIGTERM, stop)\n"
               f"open({str(log)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
               f"time.sleep(120)\n")
    env = runner_env(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="0",
                     OMPI_COMM_WORLD_LOCAL_SIZE="1", TNT_JOB_ID=JOB, TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    rank_cmd = rank_wrapper_argv() + ["--report", "--size=2", "--die-with-script", "--",
                                      sys.executable, "-c", program]
    script = tmp_path / name
    script.write_text(engines.gaspi_script(env, list(env), rank_cmd, str(tmp_path)))
    script.chmod(0o755)
    proc = subprocess.Popen([str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text().endswith("\n")) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(log.read_text().split()[0])
        if shutil.which("killall"):  # psmisc: what gaspi_run calls, by the script's name
            subprocess.run(["killall", "-9", name], check=True)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL  # the script, killed
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{child}"), "the program outlived its script"
        assert log.read_text().split()[1:] == ["SIGTERM"]  # stopped with its grace
        deadline = time.monotonic() + 10
        while os.listdir(tmp_path / "tmp") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(tmp_path / "tmp") == []  # the wrapper's folder, removed
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_gaspi_script_without_its_python_sends_the_ranks_record(tmp_path, shell):
    # no Python at tntrun's path on the rank's host: the script said "No such file or
    # directory", gaspi_run's spawner exited 0 all the same, and the other ranks waited until
    # TNT_TIMEOUT_S. The script itself now writes the rank's record (uncompressed JSON)
    from tarantella.runner import engines

    env = runner_env(GASPI_RANK="3", GASPI_SOCKET="1", TNT_JOB_ID=JOB)
    python = str(tmp_path / "no such" / "python")
    rank_cmd = [python, "-m", "tarantella.runner.rank", "--report", "--size=4", "--", python, "t.py"]
    script = tmp_path / "script.sh"
    script.write_text(engines.gaspi_script(env, [], rank_cmd, str(tmp_path)))
    res = subprocess.run([shell, str(script)], env=env, capture_output=True, timeout=60)
    assert res.returncode == 127, res.stderr
    shown, [record] = _records(res.stderr)
    message = (f"NotStartedError: rank 3 could not start on {socket.gethostname()}: {python} is not there: tntrun "
               f"runs the ranks of every host with its own Python, which must be at the same path on every host")
    assert shown.decode().startswith(message), shown
    assert record["error"]["message"].startswith(message), record
    assert (record["rank"], record["local_rank"], record["host"], record["pid"], record["returncode"],
            record["not_started"]) == (3, 1, socket.gethostname(), None, 127, True), record
    assert isinstance(record["ended_at"], (int, float)) and record["ended_at"] > 1e9, record  # a time


OLD_WRAPPER = """
import argparse, sys
def main():
    p = argparse.ArgumentParser(prog="tarantella.runner.rank")
    p.add_argument("--report", action="store_true")
    p.add_argument("--size", type=int)
    p.parse_args(sys.argv[1:sys.argv.index("--")])
    return 0
"""


@pytest.mark.parametrize("wrapper, said", [
    (OLD_WRAPPER, "its rank wrapper (tarantella.runner.rank) cannot read tntrun's arguments (unrecognized "
                  "arguments: --die-with-script): every host must have the same release of Tarantella as tntrun's"),
    ("def main(:\n", "cannot import tarantella.runner.rank (SyntaxError: "),
], ids=["another-release", "syntax-error"])
def test_a_wrapper_that_cannot_serve_this_tntrun_sends_the_ranks_record(tmp_path, wrapper, said):
    # another release of Tarantella on the rank's host: its wrapper lacked an option (argparse
    # exited 2 with its usage) or could not be imported by that Python (a SyntaxError, not an
    # ImportError): no record, and under gaspi_run the other ranks waited until TNT_TIMEOUT_S
    package = tmp_path / "tarantella"
    (package / "runner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "runner" / "__init__.py").write_text("")
    (package / "runner" / "rank.py").write_text(wrapper)
    env = runner_env(GASPI_RANK="2", GASPI_SOCKET="0", TNT_JOB_ID=JOB, PYTHONPATH=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", rank_report.bootstrap(), "--report", "--size=4",
                          "--die-with-script", "--", sys.executable, "t.py"],
                         env=env, capture_output=True, timeout=60, cwd=str(tmp_path))  # (-c: cwd first on sys.path)
    assert res.returncode == 127, res.stderr
    shown, [record] = _records(res.stderr)
    assert b"usage:" not in shown, shown
    message = f"NotStartedError: rank 2 could not start on {socket.gethostname()}: "
    assert record["error"]["message"].startswith(message) and said in record["error"]["message"], record
    assert (record["rank"], record["returncode"], record["not_started"]) == (2, 127, True), record


def test_a_rank_that_failed_fails_the_job_whose_engine_exited_0():
    # gaspi_run exits with its master rank's status alone: rank 0 ended early (exit 0), rank 1
    # failed naming it, and tntrun exited 0 without a report
    engine = ProcResult(ProcSpec(argv=["gaspi_run"], env={}, label="gaspi_run", host="hostA"), 99, returncode=0)
    records = [_end(0, 1, host="hostA", stderr_tail="left the loop early"),
               {"rank": 1, "host": "hostB", "returncode": 1, "ended_at": 10.1, "stopped": False,
                "error": {"message": "PeerLostError: rank 0 has shut down while rank 1 was in a bit round of the "
                                     "negotiation", "timestamp": 10.0, "caused_by_rank": 0}}]
    job = multi.ranks_job(JobResult(results=[engine]), records, "gaspi_run", multi.Joins())
    assert job.root_cause.spec.rank == 1 and job.exit_code == 1
    text = report.format_failure(job, "train.py")
    assert "Rank 0 (hostA, pid 70) had ended, exit code 0" in text and "left the loop early" in text, text


def test_wrapper_passes_the_programs_lines_on_whole(tmp_path):
    # tntrun runs ranks with PYTHONUNBUFFERED=1, under which print() writes the text, then the
    # newline: the wrapper passed the stderr on chunk by chunk (and left the stdout, every
    # rank's under --output-all, to the engine), and the engine put the lines of ranks writing at once together ("READY 2READY
    # 3", then empty lines). Now the wrapper writes whole lines: a line begun waits for its end
    # (here for 30 s, lines.HOLD_S, so that a slow machine cannot make it pass by itself)
    from tntrun_helpers import runner_module_argv

    wrote, go = tmp_path / "wrote", tmp_path / "go"
    program = ("import os, sys, time\n"
               "print('READY 0', end=''); print('READY 0', end='', file=sys.stderr)\n"
               f"open({str(wrote)!r}, 'w').close()\n"
               f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
               "print(); print(file=sys.stderr)\n")
    prelude = ("try:\n from tarantella.runner import lines; lines.HOLD_S = 30.0\n"
               "except ImportError: pass")
    env = runner_env(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2", TNT_JOB_ID=JOB, PYTHONUNBUFFERED="1")
    argv = runner_module_argv("rank", prelude) + ["--report", "--size=2", "--output-all", "--",
                                                  sys.executable, "-c", program]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pieces = {1: [], 2: []}

    def read(stream, into):
        while True:
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                return
            into.append(chunk)

    import threading
    readers = [threading.Thread(target=read, args=(proc.stdout, pieces[1]), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, pieces[2]), daemon=True)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 60
    while not wrote.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # (before, the wrapper, or the program itself, wrote "READY 0" meanwhile)
    assert pieces == {1: [], 2: []}, pieces
    go.touch()
    assert proc.wait(timeout=60) == 0
    for reader in readers:
        reader.join(timeout=10)
    assert pieces[1][0] == b"READY 0\n", pieces
    assert pieces[2][0] == b"READY 0\n", pieces
    shown, [record] = _records(b"".join(pieces[2]))
    assert shown == b"READY 0\n" and b"".join(pieces[1]) == b"READY 0\n"
