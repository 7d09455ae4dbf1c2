"""--pin-to-socket / --pin-memory-to-socket: bind each rank to one NUMA node ("socket").

The layout is read from /sys/devices/system/node (TNT_SYSFS_NODE_DIR overrides it, for tests):
rank r goes to node r mod (number of nodes). Binding goes through numactl, as in the original
tarantella command: --cpunodebind for CPUs, --membind for memory when asked, else
--preferred (allocate locally while there is room). CPU pinning alone falls back to taskset
when numactl is missing; memory pinning needs numactl.
"""
import glob
import os
import re
import shutil

from tarantella.runner.environment import UsageError

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


def prefix_for(node, cpus, pin_cpu, pin_memory, numactl, taskset):
    """The command prefix that binds one rank to `node`."""
    if numactl:
        args = [numactl]
        if pin_cpu:
            args.append(f"--cpunodebind={node}")
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
    nodes = numa_nodes(node_dir)
    ids = list(nodes)

    def argv_of(local_rank):
        node = ids[local_rank % len(ids)]
        return prefix_for(node, nodes[node], pin_cpu, pin_memory, numactl, taskset) + list(base_argv)

    return argv_of
