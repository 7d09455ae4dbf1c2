"""Which transports this machine can use, and why not the others (`tntrun --version`,
`tntrun --check-build`, `python -m tarantella.runner.transports`).

The core is asked first: a transport is available when the core says so. The question it
answers (looked up defensively, so that this works with a core that does not have it yet):

    const char *tnt_transport_status(const char *name);
        NULL: this core does not know the transport; "": available;
        anything else: why it is not available (one line, says what to install or set)

Where the core does not answer for a transport, the machine is searched for what that
transport needs, to say what is missing:
- shm: nothing (POSIX shared memory): always available;
- mpi: an MPI with its compiler wrapper, mpicc (the plugin is compiled with it at first use),
  or TNT_MPI_PLUGIN naming a plugin built elsewhere;
- gpi2: GPI-2 (GPI2_HOME, or libGPI2.so on the library path) and a C compiler (the plugin is
  compiled at first use and loads GPI-2 when the transport starts), or TNT_GPI2_PLUGIN.
"""
import ctypes.util
import os
import shutil
import subprocess
import sys

NAMES = ("shm", "mpi", "gpi2")
SHM = "ranks on one host, through POSIX shared memory (/dev/shm)"
MPI = "ranks on several hosts, through MPI (its plugin is built at first use)"
INSTALL_MPI = ("install Open MPI (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev; "
               "RHEL/Fedora: dnf install openmpi openmpi-devel) or MPICH, or load your cluster's "
               "MPI module")
INSTALL_GPI2 = ("set GPI2_HOME to GPI-2's install folder, or put libGPI2.so on LD_LIBRARY_PATH "
                "(https://github.com/cc-hpc-itwm/GPI-2)")


def core_status(name, lib=None):
    """The core's answer for `name`: (True, ""), (False, why), or None (no answer: no core,
    or a core without the query, or one that does not know the transport)."""
    try:
        if lib is None:
            from tarantella.common import core
            lib = core.lib()
        query = getattr(lib, "tnt_transport_status", None)
        if query is None:
            return None
        answer = query(name.encode())
        if answer is None or isinstance(answer, (bytes, str)):  # a stand-in lib (tests)
            why = answer.decode() if isinstance(answer, bytes) else answer
        else:
            from tarantella.common import core
            ffi = core.ffi()
            why = None if answer == ffi.NULL else ffi.string(answer).decode("utf-8", "replace")
        if why is None:
            return None
    except Exception:  # noqa: BLE001 - no core, an older core: answer from the machine
        return None
    return (not why, why)


def _mpi_found(environ):
    """A description of the MPI on this machine, or None."""
    found = []
    launcher = shutil.which("mpirun", path=environ.get("PATH")) or \
        shutil.which("mpiexec", path=environ.get("PATH"))
    if launcher:
        try:
            out = subprocess.run([launcher, "--version"], capture_output=True, text=True,
                                 timeout=30)
            first = next((ln.strip() for ln in (out.stdout + out.stderr).splitlines()
                          if ln.strip()), "")
        except (OSError, subprocess.SubprocessError):
            first = ""
        found.append(f"{launcher}" + (f" ({first})" if first else ""))
    compiler = shutil.which("mpicc", path=environ.get("PATH"))
    if compiler:
        found.append(compiler)
    library = ctypes.util.find_library("mpi") or ctypes.util.find_library("mpich")
    if library:
        found.append(library)
    return ", ".join(found) if found else None


def _gpi2_found(environ):
    """The GPI-2 library the gpi2 plugin would load (it looks in the same places), or None."""
    home = environ.get("GPI2_HOME")
    if home:  # the plugin looks only here when GPI2_HOME is set
        found = [p for d in ("lib64", "lib") for p in [os.path.join(home, d, "libGPI2.so")]
                 if os.path.exists(p)]
        return found[0] if found else None
    for folder in (environ.get("LD_LIBRARY_PATH") or "").split(os.pathsep):
        if folder and os.path.exists(os.path.join(folder, "libGPI2.so")):
            return os.path.join(folder, "libGPI2.so")
    return ctypes.util.find_library("GPI2")


def _compiler(environ, names):
    for var in ("TNT_CC", "CC") if names == ("cc", "gcc") else ("TNT_MPICC", "MPICC"):
        if environ.get(var, "").strip():
            return environ[var].split()[0]
    for name in names:
        found = shutil.which(name, path=environ.get("PATH"))
        if found:
            return found
    return None


def _mpi_status(environ):
    if environ.get("TNT_MPI_PLUGIN"):
        return True, f"plugin TNT_MPI_PLUGIN={environ['TNT_MPI_PLUGIN']}"
    found = _mpi_found(environ)
    mpicc = _compiler(environ, ("mpicc",))
    if found and mpicc:
        return True, f"ranks started by mpirun/srun; plugin built at first use with {mpicc} (found MPI: {found})"
    if found:
        return False, (f"found MPI ({found}) but no mpicc to build the plugin with: install the MPI's "
                       "development files (Debian/Ubuntu: libopenmpi-dev)")
    return False, f"no MPI found: {INSTALL_MPI}"


def _gpi2_status(environ):
    home = environ.get("GPI2_HOME")
    found = _gpi2_found(environ)
    if not found:
        return False, (f"GPI2_HOME={home} holds no lib64/libGPI2.so or lib/libGPI2.so: {INSTALL_GPI2}" if home
                       else f"GPI-2 not found: {INSTALL_GPI2}")
    if environ.get("TNT_GPI2_PLUGIN"):
        return True, f"GPI-2 {found}, plugin TNT_GPI2_PLUGIN={environ['TNT_GPI2_PLUGIN']}"
    cc = _compiler(environ, ("cc", "gcc"))
    if not cc:
        return False, (f"found GPI-2 ({found}) but no C compiler (cc) to build the plugin with: install "
                       "one (apt-get install gcc) or set TNT_CC")
    return True, f"GPI-2 {found}; plugin built at first use with {cc}"


def status(environ=None, lib=None):
    """[(name, available, detail)] for every transport, in the order `auto` tries them."""
    environ = os.environ if environ is None else environ
    out = []
    for name in NAMES:
        answer = core_status(name, lib)
        if answer is not None:
            ok, why = answer
            if ok and name == "shm":
                why = SHM
            elif ok and name == "mpi":  # the core found an MPI: say which, and how it is used
                why = f"{MPI} (found: {_mpi_found(environ) or 'an MPI compiler wrapper'})"
            out.append((name, ok, why))
            continue
        if name == "shm":
            out.append((name, True, SHM))
        elif name == "mpi":
            out.append((name, *_mpi_status(environ)))
        else:
            out.append((name, *_gpi2_status(environ)))
    return out


def describe(environ=None, lib=None):
    lines = ["transports (--transport; TNT_TRANSPORT):"]
    for name, ok, detail in status(environ, lib):
        lines.append(f"  {name:<5} {'available' if ok else 'not available'}: {detail}")
    lines.append("  auto  shm when every rank is on one host; across hosts shm within each host and mpi "
                 "between hosts")
    return "\n".join(lines)


def unavailable(name, environ=None, lib=None):
    """Why transport `name` cannot be used here, or None (also for auto)."""
    for other, ok, detail in status(environ, lib):
        if other == name and not ok:
            return detail
    return None


if __name__ == "__main__":
    print(describe())
    sys.exit(0)
