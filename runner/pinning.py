"""--pin-to-socket / --pin-memory-to-socket: bind each rank to one NUMA node ("socket").

The layout is read from /sys/devices/system/node (TNT_SYSFS_NODE_DIR overrides it, for tests):
rank r goes to node r mod (number of nodes), of the nodes that hold a CPU tntrun may run on (its
CPU affinity: a rank is bound to those CPUs of its node only, never beyond what taskset, a
cgroup cpuset or Slurm allows). Binding goes through numactl, as in the original
tarantella command: --cpunodebind for CPUs, --membind for memory when asked, else
--preferred (allocate locally while there is room). CPU pinning alone falls back to taskset
when numactl is missing; memory pinning needs numactl.
"""
import glob
import os
import re
import shutil

from tarantella.runner.environment import UsageError, allowed_cpus

NODE_DIR = "/sys/devices/system/node"
INSTALL_NUMACTL = ("install numactl (Debian/Ubuntu: apt-get install numactl; "
                   "RHEL/Fedora: dnf install numactl)")


def numa_nodes(node_dir=None):
    """{node id: cpulist string}, e.g. {0: "0-15", 1: "16-31"}; one node with every CPU
    when the system shows no NUMA layout."""
    node_dir = node_dir or os.environ.get("TNT_SYSFS_NODE_DIR") or NODE_DIR
    nodes = {}
    for path in glob.glob(os.path.join(node_dir, "node[0-9]*")):
        match = re.search(r"node(\d+)$", path)
        try:
            with open(os.path.join(path, "cpulist")) as f:
                cpus = f.read().strip()
        except OSError:
            continue
        if match and cpus:  # memory-only nodes have no CPUs: nothing to pin to
            nodes[int(match.group(1))] = cpus
    if not nodes:
        nodes[0] = f"0-{(os.cpu_count() or 1) - 1}"
    return dict(sorted(nodes.items()))


def parse_cpulist(text):
    """The CPUs of a kernel cpulist: "0-3,8" -> {0, 1, 2, 3, 8}."""
    cpus = set()
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus):
    """{0, 1, 2, 3, 8} -> "0-3,8"."""
    runs, ordered = [], sorted(cpus)
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in runs)


def usable_nodes(nodes, allowed):
    """{node: (cpulist, whole)}: the nodes as a process whose CPU affinity is `allowed` may
    use them. Where the affinity (taskset, a cgroup cpuset, Slurm's binding) leaves out some
    of the layout's CPUs, a node keeps only its allowed CPUs (whole False: bind to those, not
    to the node, which would leave the affinity, or fail in a cpuset), and a node with none is
    dropped. None allowed: the layout as it is."""
    layout = {node: parse_cpulist(cpus) for node, cpus in nodes.items()}
    if allowed is None or set().union(*layout.values()) & online_cpus() <= allowed:
        return {node: (cpus, True) for node, cpus in nodes.items()}
    usable = {node: (format_cpulist(cpus & allowed), False) for node, cpus in layout.items() if cpus & allowed}
    if not usable:
        raise UsageError(f"--pin-to-socket: no NUMA node of this host holds a CPU that tntrun may run on (its CPU "
                         f"affinity: {format_cpulist(allowed)}; the nodes: "
                         f"{', '.join(f'{n}: {c}' for n, c in nodes.items())}); run without pinning")
    return usable


def online_cpus():
    """The machine's online CPUs (/sys/devices/system/cpu/online)."""
    try:
        with open("/sys/devices/system/cpu/online") as f:
            return parse_cpulist(f.read())
    except (OSError, ValueError):
        return set(range(os.cpu_count() or 1))


def prefix_for(node, cpus, pin_cpu, pin_memory, numactl, taskset, whole=True):
    """The command prefix that binds one rank to `node` (to `cpus` of it unless `whole`)."""
    if numactl:
        args = [numactl]
        if pin_cpu:
            args.append(f"--cpunodebind={node}" if whole else f"--physcpubind={cpus}")
        args.append(f"--membind={node}" if pin_memory else f"--preferred={node}")
        return args
    return [taskset, "-c", cpus]


def pinned_argv_of(base_argv, pin_cpu, pin_memory, size, node_dir=None):
    """A function local_rank -> argv that runs `base_argv` bound to the rank's node."""
    numactl = shutil.which("numactl")
    taskset = shutil.which("taskset")
    if pin_memory and not numactl:
        raise UsageError(f"--pin-memory-to-socket needs numactl, which is not installed: {INSTALL_NUMACTL}")
    if pin_cpu and not (numactl or taskset):
        raise UsageError(f"--pin-to-socket needs numactl (or taskset), neither is installed: {INSTALL_NUMACTL}")
    nodes = usable_nodes(numa_nodes(node_dir), allowed_cpus())
    ids = list(nodes)

    def argv_of(local_rank):
        node = ids[local_rank % len(ids)]
        cpus, whole = nodes[node]
        return prefix_for(node, cpus, pin_cpu, pin_memory, numactl, taskset, whole) + list(base_argv)

    return argv_of
