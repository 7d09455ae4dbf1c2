"""A Slurm cluster on the multi-host test bed (see /work/shared/notes/slurm-on-one-machine.md
for what was measured): a login/controller host `slurmctl` running munged and slurmctld, and
compute hosts (hostA, hostB) each running a slurmd under its own host name. Everything lives
in one temporary folder (slurm.conf, munge key and socket, state, spool, logs); clients need
only SLURM_CONF, which env() sets.

    from slurm_cluster import SlurmCluster
    with SlurmCluster() as cluster:            # needs root, iproute2, slurmd/slurmctld, munged
        cluster.run("slurmctl", ["salloc", "-N", "2", "tntrun", "--", "prog.py"])

Each daemon runs in the foreground, inside its host's namespaces, as a child of this process.
close() stops them in the order the notes give (jobs, slurmd/slurmctld, job steps, munged),
then removes the hosts, which kills whatever is left in them; a cluster of a killed run goes
with its test bed's leftovers (multihost_testbed.cleanup_leftovers).
"""
import os
import shutil
import subprocess
import time

from multihost_testbed import Testbed, TestbedUnavailable

DAEMONS = ("slurmctld", "slurmd", "munged", "salloc", "srun", "scontrol")
CONTROLLER = "slurmctl"


class SlurmStartError(RuntimeError):
    """The daemons did not come up (their logs are in the message): a failure, not a skip."""


def unavailable_reason():
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if missing:
        return (f"a Slurm cluster on the test bed needs {', '.join(missing)} "
                "(apt-get install slurmd slurmctld slurm-client munge)")
    return None


class SlurmCluster:
    __test__ = False

    def __init__(self, nodes=("hostA", "hostB"), cpus=4):
        self.nodes = list(nodes)
        self.cpus = cpus
        self.bed = Testbed([CONTROLLER] + self.nodes)
        self.procs = []  # (name, Popen) of the daemons, in start order

    # -- making and removing ----------------------------------------------------------------
    def start(self, timeout=60):
        reason = unavailable_reason()
        if reason:
            raise TestbedUnavailable(reason)
        self.bed.start()
        try:
            self._configure()
            self._start_daemons(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _configure(self):
        d = self.dir = os.path.join(self.bed.dir, "slurm")
        for sub in ("state", "spool", "log"):
            os.makedirs(os.path.join(d, sub))
        self.key = os.path.join(d, "munge.key")
        with open(os.open(self.key, os.O_WRONLY | os.O_CREAT, 0o400), "wb") as f:
            f.write(os.urandom(1024))
        self.socket = os.path.join(d, "munge.socket")
        ctl = self.bed.addresses[CONTROLLER]
        nodes = "".join(
            f"NodeName={n} NodeHostname={n} NodeAddr={self.bed.addresses[n]} "
            f"CPUs={self.cpus} State=UNKNOWN\n" for n in self.nodes)
        self.conf = os.path.join(d, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(f"""\
ClusterName=tnttb
SlurmctldHost={CONTROLLER}({ctl})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=3
InactiveLimit=0
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\n")  # slurmd's autodetection aborts without it

    def _daemon(self, host, argv, name):
        log = open(os.path.join(self.dir, "log", f"{name}.out"), "wb")
        proc = self.bed.popen(host, argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
        log.close()
        self.procs.append((name, proc))
        return proc

    def _start_daemons(self, timeout):
        ctl = self.bed.addresses[CONTROLLER]
        self._daemon(CONTROLLER, ["munged", "-F", "-f", f"--socket={self.socket}",
                                  f"--key-file={self.key}", f"--origin={ctl}",
                                  f"--pid-file={self.dir}/munged.pid",
                                  f"--log-file={self.dir}/log/munged.log",
                                  f"--seed-file={self.dir}/munged.seed"], "munged")
        self._wait(lambda: os.path.exists(self.socket), timeout, "munged")
        self._daemon(CONTROLLER, ["slurmctld", "-D", "-f", self.conf], "slurmctld")
        for node in self.nodes:
            self._daemon(node, ["slurmd", "-D", "-N", node, "-f", self.conf], f"slurmd-{node}")
        self._wait(self._nodes_idle, timeout, "the nodes to be idle")

    def _nodes_idle(self):
        res = self.run(CONTROLLER, ["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30)
        states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.nodes)

    def _wait(self, ready, timeout, what):
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise SlurmStartError(f"{name} ended with {proc.returncode} during start-up:"
                                             f" {self.log(name)[-2000:]}")
            if time.monotonic() > deadline:
                raise SlurmStartError(f"the Slurm cluster did not start: waited {timeout} s "
                                         f"for {what}. slurmctld: {self.log('slurmctld')[-2000:]}")
            time.sleep(0.2)

    def log(self, name):
        for path in (os.path.join(self.dir, "log", f"{name}.log"),
                     os.path.join(self.dir, "log", f"{name}.out")):
            try:
                with open(path, errors="replace") as f:
                    return f.read()
            except OSError:
                continue
        return ""

    def close(self):
        """Jobs, then slurmd and slurmctld, then munged, then the hosts (and anything left
        in them: job steps)."""
        try:
            if any(name == "slurmctld" and p.poll() is None for name, p in self.procs):
                self.run(CONTROLLER, ["scancel", "--user=root"], timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.procs = []
        self.bed.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # -- using ------------------------------------------------------------------------------
    def env(self, base=None, **extra):
        return self.bed.env(base, SLURM_CONF=self.conf, **extra)

    def run(self, host, argv, env=None, timeout=120, **kwargs):
        return self.bed.run(host, argv, env=self.env() if env is None else env,
                            timeout=timeout, **kwargs)
