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
_GPU_LINE = re.compile(r"^GPU \d+:(.*)$", re.M)
_LISTED_UUID = re.compile(r"\(UUID: (GPU-[0-9A-Za-z-]+)\)")


def _proc_gpus(path):
    """[(model, uuid)] of a directory shaped like /proc/driver/nvidia/gpus, in the order of its
    entries' PCI bus ids (nvidia-smi's): each entry's `information` file says "Model:" and "GPU
    UUID:"; None where it does not."""
    devices = []
    for bus in sorted(os.listdir(path)):
        fields = {}
        try:
            with open(os.path.join(path, bus, "information")) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    fields[key.strip()] = value.strip()
        except OSError:
            pass
        devices.append((fields.get("Model"), fields.get("GPU UUID") or None))
    return devices


def _smi_gpus(text):
    """[(model, uuid)] of `nvidia-smi -L` output ("GPU 0: NVIDIA H100 (UUID: GPU-...)")."""
    devices = []
    for rest in _GPU_LINE.findall(text):
        uuid = _LISTED_UUID.search(rest)
        devices.append((rest[:uuid.start()].strip() if uuid else rest.strip() or None,
                        uuid.group(1) if uuid else None))
    return devices


def _listing(environ):
    """[(model, uuid)] of this host's GPUs, in nvidia-smi's order (None where the source says not)."""
    listing = environ.get("TNT_GPU_LISTING")
    if listing:
        if not os.path.exists(listing):
            return []
        if os.path.isdir(listing):
            return _proc_gpus(listing)
        with open(listing) as f:
            return _smi_gpus(f.read())
    if os.path.isdir(PROC_GPUS):
        return _proc_gpus(PROC_GPUS)
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            return _smi_gpus(out.stdout) if out.returncode == 0 else []
        except (OSError, subprocess.SubprocessError):
            return []
    return []


def detect(environ=None):
    """The list of GPU ids a rank may be given (strings for CUDA_VISIBLE_DEVICES)."""
    environ = os.environ if environ is None else environ
    devices = _listing(environ)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        # the user restricted the devices already: hand those out, in their order
        return _visible(visible, len(devices), _uuid_indexes(devices, environ))
    return [str(i) for i in range(len(devices))]


def of_job(args):
    """The GPU ids tntrun hands out: none with --no-gpu, else detect() in the environment the
    ranks get, -x included: `-x CUDA_VISIBLE_DEVICES=1` narrows them as the variable set before
    tntrun does (it was ignored: rank 0 ran on GPU 0, which the user had left out)."""
    if args.no_gpu:
        return []
    from tarantella.runner import environment

    return detect(environment.job_env(args, environment.parse_exports(args.exports), ""))


def _uuid_indexes(devices, environ):
    """({uuid (lower case): index in the listing}, whether that is CUDA's index) of the listed GPUs,
    or (None, False) where the listing gives no UUIDs. The listing's order is nvidia-smi's (by PCI
    bus), CUDA's only with CUDA_DEVICE_ORDER=PCI_BUS_ID or alike GPUs: by default CUDA puts the
    fastest first."""
    if not devices or any(uuid is None for _, uuid in devices):
        return None, False
    models = {model for model, _ in devices}
    ordered = environ.get("CUDA_DEVICE_ORDER", "").strip().upper() == "PCI_BUS_ID" or \
        (len(models) == 1 and None not in models)
    return {uuid.lower(): i for i, (_, uuid) in enumerate(devices)}, ordered


def _gpu_of_uuid(name, uuids):
    """The UUID (lower case) of the listed GPU that a UUID of CUDA_VISIBLE_DEVICES names, in full or
    by its first few characters (as CUDA takes it where they name one GPU); "" where it names none
    (CUDA stops there), None where it cannot be told (no UUIDs listed, or several match)."""
    if uuids is None:
        return None
    found = [uuid for uuid in uuids if uuid.startswith(name.lower())]
    return found[0] if len(found) == 1 else "" if not found else None


def _visible(visible, count, uuids=(None, False)):
    """The devices of CUDA_VISIBLE_DEVICES as CUDA reads them on a host of `count` GPUs, each once.
    CUDA stops at the first invalid index (-1, or one past the host's GPUs): "2,0" on two GPUs
    shows none, and handing out "2" and "0" put one rank on the CPU and one on GPU 0 without a
    word. A device named twice ("0,0", "0,00") is handed out once: twice, two ranks shared a GPU
    that the user meant to be two. So is a GPU named by its index and by its UUID ("0,GPU-8932f937"),
    where `uuids` (_uuid_indexes) matches them; where it cannot, unmatched() says so. A UUID of no
    listed GPU ends the list, as an invalid index does. MIG UUIDs
    are not GPUs of the listing; a GPU holds up to 7 MIG instances, so a list of MIG UUIDs is not
    cut to the GPUs' count."""
    ids, gpus_named = [], set()
    for name in (v.strip() for v in visible.split(",")):
        gpu = name
        if re.fullmatch(r"[+-]?\d+", name):
            if not 0 <= int(name) < count:
                break
            name = gpu = str(int(name))
        elif not name:
            break  # "0,,1": CUDA stops at the empty entry too
        elif name.upper().startswith("GPU-"):
            uuid = _gpu_of_uuid(name, uuids[0])
            if uuid == "":
                break  # no GPU of this host: CUDA stops at it
            gpu = name if uuid is None else str(uuids[0][uuid]) if uuids[1] else uuid
        if gpu not in gpus_named:
            gpus_named.add(gpu)
            ids.append(name)
    if not all(name.startswith("MIG-") for name in ids):
        ids = ids[:count]
    return ids


def unmatched(environ, seen):
    """What a WARNING says when the GPUs handed out (`seen`: detect(environ)) mix indexes and GPU
    UUIDs that this host's listing cannot match to CUDA's indexes (see _uuid_indexes), else None:
    "0" and a UUID of GPU 0 would put two ranks on one GPU without a word."""
    named = [name for name in seen if name.upper().startswith("GPU-")]
    if not named or len(named) == len(seen):
        return None
    devices = _listing(environ)
    uuids, ordered = _uuid_indexes(devices, environ)
    if ordered and all(_gpu_of_uuid(name, uuids) for name in named):
        return None
    why = ("its GPUs' listing gives no UUIDs" if uuids is None else
           "a UUID names several of its GPUs" if not all(_gpu_of_uuid(name, uuids) for name in named) else
           "its GPUs differ, and CUDA numbers them fastest first: set CUDA_DEVICE_ORDER=PCI_BUS_ID, "
           "nvidia-smi's order")
    return (f"CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES')} mixes GPU indexes and UUIDs, which "
            f"tntrun cannot match on this host ({why}): if an index and a UUID name one GPU, two ranks share "
            "it. Name the GPUs one way, all by index or all by UUID")


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
