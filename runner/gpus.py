"""Count this host's GPUs without importing TensorFlow and without needing a driver.

Sources, first that answers wins:
1. TNT_GPU_LISTING (for tests and unusual systems): a file in the format of `nvidia-smi -L`
   (one "GPU N: ..." line per device) or a directory shaped like /proc/driver/nvidia/gpus
   (one entry per device);
2. /proc/driver/nvidia/gpus (present whenever the NVIDIA kernel driver is loaded);
3. `nvidia-smi -L`, when that program is installed.
No listing at all means no GPU. CUDA_VISIBLE_DEVICES already set by the user restricts the
devices to those it names.
"""
import os
import re
import shutil
import subprocess

PROC_GPUS = "/proc/driver/nvidia/gpus"
_GPU_LINE = re.compile(r"^GPU \d+:", re.M)


def _count_listing(path):
    if os.path.isdir(path):
        return len(os.listdir(path))
    with open(path) as f:
        return len(_GPU_LINE.findall(f.read()))


def detect(environ=None):
    """The list of GPU ids a rank may be given (strings for CUDA_VISIBLE_DEVICES)."""
    environ = os.environ if environ is None else environ
    listing = environ.get("TNT_GPU_LISTING")
    count = 0
    if listing:
        count = _count_listing(listing) if os.path.exists(listing) else 0
    elif os.path.isdir(PROC_GPUS):
        count = len(os.listdir(PROC_GPUS))
    elif shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            count = len(_GPU_LINE.findall(out.stdout)) if out.returncode == 0 else 0
        except (OSError, subprocess.SubprocessError):
            count = 0
    ids = [str(i) for i in range(count)]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        # the user restricted the devices already: hand those out, in their order
        ids = _visible(visible, count)
    return ids


def of_job(args):
    """The GPU ids tntrun hands out: none with --no-gpu, else detect() in the environment the
    ranks get, -x included: `-x CUDA_VISIBLE_DEVICES=1` narrows them as the variable set before
    tntrun does (it was ignored: rank 0 ran on GPU 0, which the user had left out)."""
    if args.no_gpu:
        return []
    from tarantella.runner import environment

    return detect(environment.job_env(args, environment.parse_exports(args.exports), ""))


def _visible(visible, count):
    """The devices of CUDA_VISIBLE_DEVICES as CUDA reads them on a host of `count` GPUs, each once.
    CUDA stops at the first invalid index (-1, or one past the host's GPUs): "2,0" on two GPUs
    shows none, and handing out "2" and "0" put one rank on the CPU and one on GPU 0 without a
    word. A device named twice ("0,0", "0,00") is handed out once: twice, two ranks shared a GPU
    that the user meant to be two. UUIDs (GPU-..., MIG-...) cannot be checked against the
    listing; a GPU holds up to 7 MIG instances, so a list of MIG UUIDs is not cut to the GPUs'
    count."""
    ids = []
    for name in (v.strip() for v in visible.split(",")):
        if re.fullmatch(r"[+-]?\d+", name):
            if not 0 <= int(name) < count:
                break
            name = str(int(name))
        elif not name:
            break  # "0,,1": CUDA stops at the empty entry too
        if name not in ids:
            ids.append(name)
    if not all(name.startswith("MIG-") for name in ids):
        ids = ids[:count]
    return ids


def gpu_for(local_rank, local_size, ids, per_gpu=1):
    """CUDA_VISIBLE_DEVICES of a rank: GPU local_rank // per_gpu when the host's ranks fit on its
    GPUs (per_gpu ranks on each), else "" (more ranks than places: every rank on the CPU)."""
    if not ids or local_size > per_gpu * len(ids):
        return ""
    return ids[local_rank // per_gpu]


def none_named(environ, seen):
    """What a WARNING says when CUDA_VISIBLE_DEVICES names none of this host's GPUs (an index past
    them, as "2,3" set on a host of 4 and forwarded to one of 2), else None: the ranks ran on CPUs
    without a word. Not for a list that hides them on purpose ("", "-1"). `seen`: detect(environ),
    which the caller has made."""
    visible = environ.get("CUDA_VISIBLE_DEVICES", "")
    first = visible.split(",")[0].strip()
    if not first or first.startswith("-") or seen:
        return None
    present = detect({k: v for k, v in environ.items() if k != "CUDA_VISIBLE_DEVICES"})
    if not present:
        return None
    return (f"CUDA_VISIBLE_DEVICES={visible} names none of the {len(present)} GPU(s) of this host (0 to "
            f"{len(present) - 1}; CUDA reads it up to its first invalid index): running on CPUs (name this "
            "host's GPUs in it, or --no-gpu to silence this)")


def crowded(size, ids, per_gpu):
    """(what, advice) for a WARNING when `size` ranks of one host are more than its GPUs hold with
    `per_gpu` on each (gpu_for then hides every GPU), else None."""
    if not ids or size <= per_gpu * len(ids):
        return None
    places = (f"the {len(ids)} GPU(s) of this host" if per_gpu == 1 else
              f"{len(ids)} GPU(s) x {per_gpu} ranks (--ranks-per-gpu {per_gpu})")
    return places, f"--ranks-per-gpu {-(-size // len(ids))} to share the GPUs, or --no-gpu to silence this"


def rank_gpu_env(env, gpu):
    """Put a rank on `gpu` ("" hides every GPU). A rank given a GPU grows its memory as it needs
    it (TF_FORCE_GPU_ALLOW_GROWTH), unless the user chose: TensorFlow otherwise takes nearly all
    of a GPU's memory in the first process that touches it, and ranks sharing it then fail."""
    env["CUDA_VISIBLE_DEVICES"] = gpu
    if gpu and "TF_FORCE_GPU_ALLOW_GROWTH" not in env:
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
