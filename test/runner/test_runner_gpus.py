"""GPU detection from a fake device listing (never real hardware), and what ranks get."""
import subprocess
import sys

from tntrun_helpers import import_runner, rank_wrapper_argv, run_tntrun, runner_env

import_runner()
from tarantella.runner import gpus  # noqa: E402

LISTING = "GPU 0: NVIDIA H100 (UUID: GPU-a)\nGPU 1: NVIDIA H100 (UUID: GPU-b)\n"


def _listing(tmp_path, text=LISTING):
    path = tmp_path / "nvidia-smi-L.txt"
    path.write_text(text)
    return str(path)


def test_detect_from_nvidia_smi_listing(tmp_path):
    assert gpus.detect({"TNT_GPU_LISTING": _listing(tmp_path)}) == ["0", "1"]


def test_detect_from_proc_directory(tmp_path):
    d = tmp_path / "gpus"
    for bus in ("0000:17:00.0", "0000:65:00.0", "0000:ca:00.0"):
        (d / bus).mkdir(parents=True)
    assert gpus.detect({"TNT_GPU_LISTING": str(d)}) == ["0", "1", "2"]


def test_detect_respects_cuda_visible_devices(tmp_path):
    listing = _listing(tmp_path)
    assert gpus.detect({"TNT_GPU_LISTING": listing, "CUDA_VISIBLE_DEVICES": "1"}) == ["1"]
    assert gpus.detect({"TNT_GPU_LISTING": listing, "CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpus.detect({"TNT_GPU_LISTING": str(tmp_path / "absent")}) == []


def test_detect_reads_cuda_visible_devices_as_cuda_does(tmp_path):
    """Each device once, and none past the first invalid index (CUDA masks those): before, "0,0"
    gave two ranks GPU 0 and "2,0" put rank 0 on no GPU and rank 1 on GPU 0, without a word."""
    listing = _listing(tmp_path)
    seen = {cvd: gpus.detect({"TNT_GPU_LISTING": listing, "CUDA_VISIBLE_DEVICES": cvd})
            for cvd in ("1,0", "0,0", "1,01", " 1 , 0 ", "2,0", "0,2,1", "0,-1,1", "0,,1", "GPU-b,GPU-a,GPU-c",
                        "MIG-x,MIG-y,MIG-z")}
    assert seen == {"1,0": ["1", "0"], "0,0": ["0"], "1,01": ["1"], " 1 , 0 ": ["1", "0"], "2,0": [],
                    "0,2,1": ["0"], "0,-1,1": ["0"], "0,,1": ["0"], "GPU-b,GPU-a,GPU-c": ["GPU-b", "GPU-a"],
                    # MIG instances are not GPUs of the listing: a GPU holds up to 7
                    "MIG-x,MIG-y,MIG-z": ["MIG-x", "MIG-y", "MIG-z"]}



def test_a_gpu_named_by_index_and_by_uuid_is_handed_out_once(tmp_path):
    """CUDA_VISIBLE_DEVICES may name a GPU by its index or its UUID, in full or by its first
    characters: "0,GPU-a1" named GPU 0 twice, and two ranks shared it without a word. The UUIDs of the
    listing (nvidia-smi -L, /proc's information files) match them to indexes, where its order is
    CUDA's (alike GPUs, or CUDA_DEVICE_ORDER=PCI_BUS_ID); where it cannot, a WARNING says so."""
    listing = _listing(tmp_path, "GPU 0: NVIDIA H100 (UUID: GPU-a1b2)\nGPU 1: NVIDIA H100 (UUID: GPU-c3d4)\n")
    seen = {cvd: gpus.detect({"TNT_GPU_LISTING": listing, "CUDA_VISIBLE_DEVICES": cvd})
            for cvd in ("0,GPU-a1b2", "GPU-a1,0,1", "GPU-C3D4,1,0", "GPU-a1b2,GPU-a", "GPU-zz,0", "GPU-c3d4,GPU-a1b2")}
    assert seen == {"0,GPU-a1b2": ["0"], "GPU-a1,0,1": ["GPU-a1", "1"], "GPU-C3D4,1,0": ["GPU-C3D4", "0"],
                    "GPU-a1b2,GPU-a": ["GPU-a1b2"], "GPU-zz,0": [],  # no GPU of this host: CUDA stops there
                    "GPU-c3d4,GPU-a1b2": ["GPU-c3d4", "GPU-a1b2"]}
    proc = tmp_path / "gpus"  # /proc/driver/nvidia/gpus: entries by PCI bus id, in that order
    for bus, model, uuid in (("0000:65:00.0", "NVIDIA A100", "GPU-c3d4"), ("0000:17:00.0", "NVIDIA H100", "GPU-a1b2")):
        (proc / bus).mkdir(parents=True)
        (proc / bus / "information").write_text(f"Model: \t\t {model}\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n")
    env = {"TNT_GPU_LISTING": str(proc), "CUDA_VISIBLE_DEVICES": "1,GPU-c3d4", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpus.detect(env) == ["1"] and gpus.unmatched(env, ["1"]) is None
    # GPUs that differ, numbered fastest first by CUDA: the listing's order may not be CUDA's
    del env["CUDA_DEVICE_ORDER"]
    assert gpus.detect(env) == ["1", "GPU-c3d4"]
    assert ("CUDA_VISIBLE_DEVICES=1,GPU-c3d4 mixes GPU indexes and UUIDs, which tntrun cannot match on this host "
            "(its GPUs differ, and CUDA numbers them fastest first: set CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi's "
            "order): if an index and a UUID name one GPU, two ranks share it") in gpus.unmatched(env, ["1", "GPU-c3d4"])
    env = {"TNT_GPU_LISTING": _listing(tmp_path, LISTING.replace(" (UUID: GPU-a)", "")), "CUDA_VISIBLE_DEVICES": "0,GPU-b"}
    assert "(its GPUs' listing gives no UUIDs)" in gpus.unmatched(env, gpus.detect(env))
    assert gpus.unmatched(env, ["GPU-a", "GPU-b"]) is None and gpus.unmatched(env, ["0", "1"]) is None


RANK = "print(os.environ['TNT_RANK'], repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n"
GROWTH = ("print(os.environ['TNT_RANK'], repr(os.environ.get('CUDA_VISIBLE_DEVICES')), "
          "os.environ.get('TF_FORCE_GPU_ALLOW_GROWTH'))\n")


def test_one_rank_per_gpu_by_default(script, tmp_path):
    env = runner_env(TNT_GPU_LISTING=_listing(tmp_path))
    res = run_tntrun(["--output-on-all-devices", "--", script(GROWTH)], env=env)
    assert res.returncode == 0, res.stderr
    # every rank on a GPU grows its memory as it needs it: no rank takes a whole GPU
    assert sorted(res.stdout.splitlines()) == ["[0] 0 '0' true", "[1] 1 '1' true"]
    assert "WARNING" not in res.stderr
    # the user's CUDA_VISIBLE_DEVICES given with -x narrows the GPUs as one set before tntrun does: it was
    # ignored, and rank 0 ran on GPU 0, which the user had left out
    res = run_tntrun(["-x", "CUDA_VISIBLE_DEVICES=1", "--", script(GROWTH)], env=env)
    assert res.returncode == 0 and res.stdout.strip() == "0 '1' true", res.stdout + res.stderr


def test_ranks_share_gpus_when_asked(script, tmp_path):
    env = runner_env(TNT_GPU_LISTING=_listing(tmp_path))
    res = run_tntrun(["--ranks-per-gpu", "2", "--output-on-all-devices", "--", script(GROWTH)], env=env)
    assert res.returncode == 0, res.stderr  # no -n: 2 ranks on each of the 2 GPUs
    assert sorted(res.stdout.splitlines()) == ["[0] 0 '0' true", "[1] 1 '0' true", "[2] 2 '1' true",
                                               "[3] 3 '1' true"]
    res = run_tntrun(["-n", "3", "--ranks-per-gpu", "2", "--output-on-all-devices", "--", script(RANK)], env=env)
    assert sorted(res.stdout.splitlines()) == ["[0] 0 '0'", "[1] 1 '0'", "[2] 2 '1'"]
    res = run_tntrun(["-n", "5", "--ranks-per-gpu", "2", "--", script(RANK)], env=env)
    assert res.returncode == 0 and res.stdout.strip() == "0 ''"
    assert "WARNING: -n 5 is more than 2 GPU(s) x 2 ranks (--ranks-per-gpu 2)" in res.stderr
    assert "--ranks-per-gpu 3 to share the GPUs" in res.stderr
    chosen = run_tntrun(["-n", "2", "--output-on-all-devices", "-x", "TF_FORCE_GPU_ALLOW_GROWTH=false", "--",
                         script(GROWTH)], env=env)
    assert sorted(chosen.stdout.splitlines()) == ["[0] 0 '0' false", "[1] 1 '1' false"]  # the user's choice stays


def test_more_ranks_than_gpus_warns_and_runs_on_cpus(script, tmp_path):
    env = runner_env(TNT_GPU_LISTING=_listing(tmp_path))
    res = run_tntrun(["-n", "3", "--output-on-all-devices", "--", script(RANK)], env=env)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[0] 0 ''", "[1] 1 ''", "[2] 2 ''"]
    assert "WARNING: -n 3 is more than the 2 GPU(s)" in res.stderr


def test_cuda_visible_devices_naming_no_gpu_of_the_host_is_said(script, tmp_path):
    """An index past the host's GPUs ("2" on a host of 2) hides them all: the ranks ran on CPUs without a
    word with -n (and with "no GPU found" without). Not for "" or "-1", which hide them on purpose."""
    for cvd, warned in (("2", True), ("2,0", True), ("-1", False), ("", False)):
        env = runner_env(TNT_GPU_LISTING=_listing(tmp_path), CUDA_VISIBLE_DEVICES=cvd)
        res = run_tntrun(["-n", "2", "--", script(RANK)], env=env)
        assert res.returncode == 0 and res.stdout.strip() == f"0 {cvd!r}", res.stdout + res.stderr
        assert ("WARNING" in res.stderr) == warned, (cvd, res.stderr)
        if warned:
            assert (f"WARNING: CUDA_VISIBLE_DEVICES={cvd} names none of the 2 GPU(s) of this host (0 to 1; CUDA "
                    "reads it up to its first invalid index): running on CPUs (name this host's GPUs in it, or "
                    "--no-gpu to silence this)") in res.stderr, res.stderr
    env["CUDA_VISIBLE_DEVICES"] = "2"
    res = run_tntrun(["--", script(RANK)], env=env)  # no -n: the same WARNING, not "no GPU found"
    assert res.returncode == 0 and res.stderr.count("WARNING") == 1 and "names none" in res.stderr, res.stderr


def test_no_gpu_hides_gpus_without_warning(script, tmp_path):
    env = runner_env(TNT_GPU_LISTING=_listing(tmp_path))
    for flag in ("--no-gpu", "--no-gpus"):
        res = run_tntrun(["-n", "3", flag, "--", script(RANK)], env=env)
        assert res.returncode == 0 and res.stdout.strip() == "0 ''"
        assert "GPU" not in res.stderr


def test_no_gpu_present(script):
    res = run_tntrun(["--", script(RANK)])  # the helpers' environment has no GPU
    assert res.returncode == 0 and res.stdout.strip() == "0 None"
    assert "WARNING: no GPU found: running 1 rank on the CPU" in res.stderr
    res = run_tntrun(["-n", "2", "--", script(RANK)])
    assert res.returncode == 0 and "WARNING" not in res.stderr


def test_rank_wrapper_shares_gpus_on_other_hosts(tmp_path):
    """What a rank started by mpirun/srun/gaspi_run on another host does with --ranks-per-gpu."""
    env = runner_env(TNT_GPU_LISTING=_listing(tmp_path), GASPI_RANK="3")
    show = ("import os; print(os.environ['TNT_LOCAL_RANK'], os.environ['CUDA_VISIBLE_DEVICES'], "
            "os.environ['TF_FORCE_GPU_ALLOW_GROWTH'])")
    res = subprocess.run(rank_wrapper_argv() + ["--size=4", "--per-node=4", "--ranks-per-gpu=2", "--output-all",
                                                "--", sys.executable, "-c", show],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["3", "1", "true"]  # local rank 3 of 4, two per GPU: GPU 1
    assert "WARNING" not in res.stderr
    # a host whose GPUs are fewer than its ranks (hosts of different sizes; tntrun counted its
    # own): its ranks run on CPUs, and its first rank says so (before, not a word)
    show = "import os; print(os.environ['TNT_LOCAL_RANK'], repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    for rank, warned in (("4", True), ("5", False)):
        env["GASPI_RANK"] = rank
        res = subprocess.run(rank_wrapper_argv() + ["--size=8", "--per-node=4", "--output-all", "--",
                                                    sys.executable, "-c", show],
                             env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == [str(int(rank) - 4), "''"]
        assert ("WARNING" in res.stderr) == warned, res.stderr
        if warned:
            assert (", 4 ranks are more than the 2 GPU(s) of this host: running them on CPUs (use "
                    "--n-per-node 2, --ranks-per-gpu 2 to share the GPUs, or --no-gpu to silence this)"
                    in res.stderr), res.stderr
    # CUDA_VISIBLE_DEVICES forwarded from tntrun's host ("2,3" of its 4 GPUs) names none of this host's 2
    env.update(GASPI_RANK="4", CUDA_VISIBLE_DEVICES="2,3")
    res = subprocess.run(rank_wrapper_argv() + ["--size=6", "--per-node=2", "--output-all", "--",
                                                sys.executable, "-c", show],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.split() == ["0", "'2,3'"], res.stdout + res.stderr
    assert "WARNING: on " in res.stderr and "CUDA_VISIBLE_DEVICES=2,3 names none of the 2 GPU(s)" in res.stderr
