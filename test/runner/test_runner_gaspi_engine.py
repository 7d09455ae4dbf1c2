"""gaspi_run under tntrun (gaspi_ssh.py): the job lasts until the ranks that gaspi_run started
on every host through ssh have ended, however fast its rank 0 ends."""
import os
import shlex
import sys
import time

from tntrun_helpers import import_runner, runner_module_argv

import_runner()
from tarantella.runner import gaspi_ssh  # noqa: E402


def test_the_engine_waits_for_starting_calls_not_yet_running_when_rank_0_ended(tmp_path):
    # gaspi_run starts each host's ranks with `ssh HOST "nohup ssh.spawner ..." &` and ends with
    # rank 0. A rank 0 that ends at once (a program with no collective) let gaspi_run end before
    # the starting calls, each a Python process starting up, held their lock: tntrun ended the
    # job and the other ranks' output was lost (test_gpi2_multihost failed now and then with
    # rank 0's line alone). Here the starting calls begin 1 s after this gaspi_run ended
    machinefile = tmp_path / "machines"
    machinefile.write_text("hostA\nhostA\nhostB\n")
    lock = str(tmp_path / "ranks.lock")
    done = tmp_path / "done"
    real_ssh = tmp_path / "real_ssh"  # the ranks of a host: they run 1 s, then leave a mark
    real_ssh.write_text(f"#!/bin/sh\nsleep 1\necho \"$1\" >> {shlex.quote(str(done))}\n")
    real_ssh.chmod(0o755)
    shim = shlex.join([*runner_module_argv("gaspi_ssh"), str(real_ssh), "f" * 32, str(machinefile), lock])
    calls = " & ".join(f"(sleep 1; exec {shim} {host} 'nohup ssh.spawner {host}')" for host in ("hostA", "hostB"))
    gaspi_run = ["/bin/sh", "-c", f"{calls} & exit 0"]
    started = time.monotonic()
    assert gaspi_ssh.engine(lock, str(machinefile), gaspi_run) == 0
    # both hosts' ranks ended before the engine did (before: it returned after ~0 s, no mark)
    assert sorted(done.read_text().split()) == ["hostA", "hostB"]
    assert time.monotonic() - started >= 2.0
    # one starting call per host, the master's included (gaspi_run's `uniq -c`)
    assert gaspi_ssh._starting_calls(str(machinefile)) == 2


def test_a_starting_call_that_never_comes_is_not_waited_for_forever(tmp_path, monkeypatch):
    # a host whose starting call could not even start (no Python there) must not hang tntrun
    machinefile = tmp_path / "machines"
    machinefile.write_text("hostA\nhostB\n")
    monkeypatch.setattr(gaspi_ssh, "STARTING_CALLS_WAIT_S", 0.5)
    started = time.monotonic()
    assert gaspi_ssh.engine(str(tmp_path / "lock"), str(machinefile), [sys.executable, "-c", "pass"]) == 0
    assert time.monotonic() - started < 10
    assert gaspi_ssh.engine(str(tmp_path / "lock"), str(machinefile), [sys.executable, "-c", "raise SystemExit(3)"]) == 3


def test_a_failed_gaspi_run_waits_a_while_for_the_ranks_of_other_hosts(tmp_path, monkeypatch):
    # rank 1 on hostB exits 4 (sys.exit), rank 0, told that it shut down, raises and ends
    # first, and gaspi_run with it (exit 1): the engine returned at once, tntrun ended the job
    # and rank 1's record, written as it ended, never came (the report blamed rank 0)
    machinefile = tmp_path / "machines"
    machinefile.write_text("hostA\nhostB\n")
    lock = str(tmp_path / "ranks.lock")
    done = tmp_path / "done"
    real_ssh = tmp_path / "real_ssh"  # hostB's rank: ends 1 s after gaspi_run failed
    real_ssh.write_text(f"#!/bin/sh\nsleep 1.5\necho \"$1\" >> {shlex.quote(str(done))}\n")
    real_ssh.chmod(0o755)
    shim = shlex.join([*runner_module_argv("gaspi_ssh"), str(real_ssh), "f" * 32, str(machinefile), lock])
    gaspi_run = ["/bin/sh", "-c", f"{shim} hostB 'nohup ssh.spawner hostB' & sleep 0.5; exit 1"]
    assert gaspi_ssh.engine(lock, str(machinefile), gaspi_run) == 1
    assert done.read_text().split() == ["hostB"]
    # ... but not for ever: ranks that go on (no collective to fail in) are stopped by tntrun
    monkeypatch.setattr(gaspi_ssh, "FAILED_RANKS_WAIT_S", 0.5)
    late = tmp_path / "late"
    real_ssh.write_text(f"#!/bin/sh\nsleep 4\ntouch {shlex.quote(str(late))}\n")
    assert gaspi_ssh.engine(lock, str(machinefile), gaspi_run) == 1
    assert not late.exists()  # returned while that rank still ran


def test_the_ranks_stderr_stays_apart_from_their_stdout(tmp_path):
    # gaspi_run starts the ranks of every host (all but its rank 0) with
    # `ssh HOST "nohup ssh.spawner ... 2>&1"`: their stderr came on tntrun's stdout, so
    # `tntrun --transport gpi2 ... 2>/dev/null` still showed rank 1's tracebacks. The shim
    # runs the command without that 2>&1: stderr reaches stderr, as under mpirun
    import subprocess

    machinefile = tmp_path / "machines"
    machinefile.write_text("hostA\nhostB\n")
    spawner = tmp_path / "ssh.spawner"  # the ranks of hostB
    spawner.write_text("#!/bin/sh\necho \"out of $1\"\necho \"err of $1\" >&2\n")
    spawner.chmod(0o755)
    real_ssh = tmp_path / "real_ssh"  # runs the remote command as sshd would: one string, by a shell
    real_ssh.write_text("#!/bin/sh\nshift\nexec /bin/sh -c \"$*\"\n")
    real_ssh.chmod(0o755)
    shim = [*runner_module_argv("gaspi_ssh"), str(real_ssh), "f" * 32, str(machinefile), str(tmp_path / "lock")]
    # (gaspi_run's command, with its empty $(cat /dev/null) before the 2>&1)
    res = subprocess.run([*shim, "hostB", f"GPI2_OFI_PROVIDER='' nohup {spawner} hostB  2>&1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "out of hostB\n", res
    assert res.stderr == "err of hostB\n", res


def test_lines_are_passed_on_whole_and_a_line_begun_shows_in_time():
    # gaspi_run's ssh calls of every host write into its same stdout, and ssh's reads cut
    # lines anywhere: a line's half, then another host's line. whole_lines (lines.py) gives
    # whole lines, but a line begun (a progress bar) after hold_s all the same
    from tarantella.runner import lines

    r, w = os.pipe()
    pieces = lines.whole_lines(r, hold_s=30.0)
    os.write(w, b"one\ntw")
    assert next(pieces) == b"one\n"
    import array
    import fcntl
    import termios
    import threading

    left = array.array("i", [0])
    got = []
    reader = threading.Thread(target=lambda: got.append(next(pieces)), daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until "tw" was read: the reader waits for the rest
        fcntl.ioctl(r, termios.FIONREAD, left)
        if left[0] == 0:
            break
        time.sleep(0.01)
    time.sleep(0.2)
    os.write(w, b"o\nthr")
    reader.join(timeout=30)
    assert got == [b"two\n"]
    os.close(w)
    assert next(pieces) == b"thr" and next(pieces, None) is None  # the end: what is left
    os.close(r)
    r, w = os.pipe()
    shown = lines.whole_lines(r, hold_s=0.2)
    os.write(w, b"Epoch 1/3 [===")
    started = time.monotonic()
    assert next(shown) == b"Epoch 1/3 [==="  # not held until a newline that does not come
    assert time.monotonic() - started < 25  # well inside the 30 s hold above
    os.close(w)
    assert next(shown, None) is None
    os.close(r)
