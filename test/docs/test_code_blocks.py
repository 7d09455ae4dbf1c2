"""Every code block of every documentation page runs, or says why not.

- python blocks: all of them, of every page, and the examples in the
  docstrings of the public API, in one launch of 2 ranks
  (run_python_blocks.py); fragments get the names they assume (doc_fragments.py);
- shell blocks: page by page, in order, each with `bash -e` in a folder of
  the page's own, holding the page's `<!-- file: NAME -->` blocks, examples/,
  and stand-ins for the files the pages' commands name (STAND_INS below);
- marks (doc_blocks.py): a reason for every block that does not run here,
  every file block used, every `run-by` block run by that test;
- what the pages quote as a command's output (EXPECTED_OUTPUT below) is in the
  output of the block that runs it, and the `tnt.NAME`s the pages cite exist
  (run_python_blocks.py).
With TNT_TEST_RUNNER_FROM_SOURCE set, the blocks' `tntrun` is this checkout's
runner/, as for test/runner.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import warnings

import pytest

import doc_blocks as db
import doc_fragments as fragments
import test_examples

# the program of the pages' `tntrun ... -- train.py` lines (unless the page
# writes its own): it talks to the other ranks, so a launch that started them
# wrongly fails
TRAIN_PY = '''\
import sys

import numpy as np
import tarantella as tnt

total = tnt.allreduce(np.ones(1))
print(f"train.py {' '.join(sys.argv[1:])}: rank {tnt.get_rank()} of {tnt.get_size()}, "
      f"allreduce {total[0]:g}")
'''

# files the pages' commands name, in every page's folder
STAND_INS = {
    "train.py": TRAIN_PY,
    "mypackage/__init__.py": "",
    "mypackage/train.py": TRAIN_PY,                       # tntrun -m -- mypackage.train
    "run.sh": '#!/bin/sh\necho "run.sh: rank $TNT_RANK of $TNT_SIZE"\n',  # --no-python
    "hosts": f"{socket.gethostname()} slots=2\n",         # a hostfile naming this machine
}
# commands the pages name, on PATH: `python3.12 train.py` (any interpreter
# name works the same; this one is the Python running the tests)
STAND_IN_COMMANDS = {"python3.12": sys.executable}


# what the pages say a command prints, checked in the output of the shell block that runs
# it (the exact line of the block -> regular expressions, each to be found; with a count, to
# be found that many times): a block that still exits 0 but no longer prints what the text
# around it quotes is drift all the same
EXPECTED_OUTPUT = {
    # README.md: the program gets its arguments, on 4 ranks that reach each other
    "tntrun -n 4 -- train.py --epochs 3     # 4 ranks on this host (`tarantella` is the same command)":
        [r"train\.py --epochs 3: rank 0 of 4, allreduce 4"],
    # quickstart.md: both runs print, and of the two ranks only rank 0 does
    "tntrun -n 2 -- train.py     # two ranks": [(r"accuracy per epoch: \[", 2)],
    # installation.md: "it prints `[2.]`", and the INFO line of the transport
    'tntrun -n 2 -- python -c "import numpy, tarantella as tnt; print(tnt.allreduce(numpy.ones(1)))"':
        [r"(?m)^\[2\.\]$"],
    'TNT_LOG_LEVEL=INFO tntrun -n 2 -- python -c "import tarantella as tnt; tnt.init()" 2>&1 | grep "transport"':
        [r"transport shm selected \(TNT_TRANSPORT=auto\)"],
    # troubleshooting.md: the hang's error, and rank 1 (stopped by tntrun) as the root cause
    'tntrun -n 2 --timeout 5 -- hang.py || echo "tntrun exited with $?"': [
        r"TimeoutError: allreduce 'allreduce\.1' was submitted on rank 0 \d+ s ago but ranks \[1\] "
        r"never submitted it .*rank 1 \(pid \d+ on \S+\) is alive but did not answer",
        r"Root cause \(first failure not caused by another rank\):\n  rank:    1 \(local_rank 1\)",
        r"Other failures:\n  rank:    0 ", r"tntrun exited with \d+"],
    # troubleshooting.md: the report of a failed rank, as quoted
    # (whether rank 0 was still running, and so "Stopped by tntrun", is a race: rank 1's
    # abort lets rank 0's collective fail as rank 1 exits)
    'tntrun -n 2 -- fail.py || echo "tntrun exited with $?"': [
        r"=+\ntntrun: fail\.py FAILED\n-+\n"
        r"Root cause \(first failure not caused by another rank\):\n  rank:    1 \(local_rank 1\)",
        r"error:   ValueError: rank 1 found a bad input file", r"tntrun exited with 1\b"],
    # troubleshooting.md: the ranks died with their tntrun; what is left is its files
    "tntrun --cleanup -- sleepy.py  # what is left of its jobs: processes, shared memory, files": [
        # (of as many ranks as it had started when it was killed: 2, unless a loaded machine
        # had not started both within the block's 2 s)
        r"tntrun --cleanup: job \w+ \(sleepy\.py, started by tntrun pid \d+, gone\): "
        r"0 of \d process\(es\) still running", ("sent SIG", 0)],
}


# blocks that fail because of a bug outside the docs (reported): a warning
# while they fail; once one passes, the test fails until its entry is removed
KNOWN_FAILURES = {}  # block -> why it fails today; the test fails once one passes


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TNT_", "SLURM_", "OMPI_", "PMI_", "PMIX_"))}
    bin_dir = tmp_path / "stand-in-bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        for name, target in STAND_IN_COMMANDS.items():
            os.symlink(target, bin_dir / name)
    source = db.launcher_from_source(str(tmp_path / "launcher-bin"))
    env["PATH"] = os.pathsep.join(([source] if source else []) + [
        os.path.dirname(sys.executable), env.get("PATH", ""), str(bin_dir)])
    env["PYTHONPATH"] = db.REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["TNT_STATE_DIR"] = str(tmp_path / "tntrun-state")  # --cleanup sees only our jobs
    env["TNT_TIMEOUT_S"] = "60"
    return env


def _page_folder(tmp_path, page):
    folder = tmp_path / page.replace("/", "_").replace(".md", "")
    folder.mkdir()
    for name, content in STAND_INS.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(content)
    (folder / "run.sh").chmod(0o755)
    os.symlink(os.path.join(db.REPO, "examples"), folder / "examples")
    for block in db.blocks(page):
        if block.mark == "file":
            (folder / block.value).write_text(block.text)
    return folder


def _runs(block):
    return block.kind in ("python", "shell") and block.mark in (None, "requires")


def test_every_code_block_runs_or_says_why_not():
    problems = []
    commands = {c.strip() for c in test_examples.COMMANDS.values()}
    quoted = set()  # every line of the shell blocks that run
    for page in db.code_pages():
        blocks = db.blocks(page)
        shell = "\n".join(b.text for b in blocks if b.kind == "shell" and _runs(b))
        for b in blocks:
            where = f"{b.id} ({b.mark}: {b.value})"
            if b.mark and not b.value:
                problems.append(f"{where}: the mark says nothing")
            elif b.mark and b.kind not in ("python", "shell"):
                problems.append(f"{where}: marks a block that is not code")
            elif b.mark == "file" and (b.kind != "python" or b.value not in shell):
                problems.append(f"{where}: no shell block of the page runs {b.value}")
            elif b.mark == "run-by" and (b.value != "test/docs/test_examples.py"
                                         or b.text.strip() not in commands):
                problems.append(f"{where}: not a command of test/docs/test_examples.py")
            elif b.mark == "requires" and b.kind != "shell":
                problems.append(f"{where}: `requires` is for shell blocks")
            if b.kind == "shell" and _runs(b):
                quoted.update(line.strip() for line in b.text.splitlines())
        for path in db.literal_includes(page):
            if not any(path in c for c in commands):
                problems.append(f"{page} includes {path}, which test_examples.py does not run")
    problems += [f"EXPECTED_OUTPUT names {line!r}, which no shell block that runs holds"
                 for line in EXPECTED_OUTPUT if line not in quoted]
    assert not problems, "\n".join(problems)


def test_python_blocks_and_docstring_examples_on_two_ranks(tmp_path):
    spec = []
    for page in db.code_pages():
        blocks = [b for b in db.blocks(page) if b.kind == "python" and _runs(b)]
        if blocks:
            spec.append({"page": page, "dir": str(_page_folder(tmp_path, page)),
                         "fragments": page in fragments.FRAGMENT_PAGES,
                         "blocks": [{"id": b.id, "text": b.text} for b in blocks]})
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "out").mkdir()
    result = subprocess.run(
        [shutil.which("tntrun", path=_env(tmp_path)["PATH"]), "-n", "2", "--no-gpu", "--",
         sys.executable, os.path.join(db.HERE, "run_python_blocks.py"),
         str(tmp_path / "spec.json"), str(tmp_path / "out")],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    expected = {block["id"] for page in spec for block in page["blocks"]}
    for rank in (0, 1):
        results = json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())
        assert expected <= set(results), f"rank {rank} did not run {expected - set(results)}"
        failed = {k: v for k, v in results.items() if v is not None and k not in KNOWN_FAILURES}
        assert not failed, f"rank {rank}:\n" + "\n".join(f"--- {k}\n{v}" for k, v in failed.items())
        fixed = [k for k in KNOWN_FAILURES if k in results and results[k] is None]
        assert not fixed, f"{fixed} pass now: remove them from KNOWN_FAILURES"
        for k, why in KNOWN_FAILURES.items():
            if results.get(k) is not None and rank == 0:
                warnings.warn(f"{k} fails (known): {why}")
        assert any(k.startswith("docstring of") for k in results), "no docstring example found"


SHELL_PAGES = [p for p in db.code_pages() if any(b.kind == "shell" and _runs(b) for b in db.blocks(p))]


@pytest.mark.parametrize("page", SHELL_PAGES)
def test_shell_blocks(page, tmp_path):
    folder = _page_folder(tmp_path, page)
    for block in db.blocks(page):
        if block.kind != "shell" or not _runs(block):
            continue
        if block.mark == "requires" and not shutil.which(block.value, path=_env(tmp_path)["PATH"]):
            warnings.warn(f"{block.id} not run: it needs {block.value}, which is not installed")
            continue
        result = subprocess.run(["bash", "-e", "-c", block.text], cwd=folder, env=_env(tmp_path),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (f"{block.id} failed ({result.returncode}):\n{block.text}\n"
                                        f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
        output = result.stdout + result.stderr
        for line in (ln.strip() for ln in block.text.splitlines()):
            for expected in EXPECTED_OUTPUT.get(line, ()):
                pattern, count = expected if isinstance(expected, tuple) else (expected, None)
                found = len(re.findall(pattern, output))
                assert found == count if count is not None else found, (
                    f"{block.id}: the page says `{line}` prints {pattern!r}"
                    f"{'' if count is None else f' {count} time(s)'}; found {found}:\n{output[-5000:]}")
