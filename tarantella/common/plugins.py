"""Transports loaded at run time: find or build their plugin (docs/transport.md).

Two plugins: mpi (below) and gpi2. The gpi2 plugin loads GPI-2 itself when the
transport starts (dlopen: $GPI2_HOME, or libGPI2.so on the library path), so it
is compiled with the plain C compiler ($TNT_CC, $CC, else cc) and its folder,
gpi2-abi<N>-<digest>, depends only on its sources and that compiler: the same
library serves every GPI-2 install. $TNT_GPI2_PLUGIN names one built elsewhere.

The mpi transport is a shared library compiled at first use with the MPI's own
compiler wrapper (`mpicc`, or $TNT_MPICC / $MPICC) into a per-user cache,
$XDG_CACHE_HOME/tarantella/plugins (default ~/.cache), in a folder named after
the MPI (implementation and version from mpi.h), the core's plugin ABI and a
digest of everything that went into the build (sources, compiler wrapper and
its compile line). A later run with the same MPI loads it at once; another MPI
(`module load`, a new install) gets its own build. `pip install` needs no MPI.

The core finds the library through $TNT_MPI_PLUGIN, which is set here before
the core starts (a user may set it to a plugin built elsewhere: nothing is
built then). When the plugin cannot be had, the error says why: no MPI found,
or the compiler's output (kept in build.log next to where the library would be).
"""
import hashlib
import json
import os
import re
import shutil

from tarantella.common import build_cache, engine_ranks, errors

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_PACKAGED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_plugin_src")

# What the plugin is compiled from, relative to core/ (setup.py ships the same
# files in tarantella/_plugin_src for installs that are not editable).
SOURCES = ("src/transport/plugins/mpi.c", "src/transport/plugins/gpi2.c", "src/transport_plugin.h",
           "src/transport.h", "src/params.h", "src/transport/process_state.h", "src/transport/host_load.h",
           "src/transport/plugins/plugin_util.h", "src/transport/plugins/shared_entries.h",
           "src/transport/plugins/peer_health.h", "src/transport/plugins/wedge_watch.h", "include/tarantella.h")
HEADERS = ("src/transport_plugin.h", "src/transport.h", "src/params.h", "src/transport/process_state.h",
           "src/transport/host_load.h", "src/transport/plugins/plugin_util.h", "src/transport/plugins/shared_entries.h",
           "src/transport/plugins/peer_health.h", "src/transport/plugins/wedge_watch.h", "include/tarantella.h")
LIBRARY = "libtnt-transport-mpi.so"
GPI2_LIBRARY = "libtnt-transport-gpi2.so"
_MPI_SOURCE = "src/transport/plugins/mpi.c"
_GPI2_SOURCE = "src/transport/plugins/gpi2.c"
_VERSION_MACROS = ("OMPI_MAJOR_VERSION", "OMPI_MINOR_VERSION", "OMPI_RELEASE_VERSION", "MPICH_VERSION",
                   "I_MPI_VERSION", "MVAPICH2_VERSION", "MPI_VERSION", "MPI_SUBVERSION")


def source_dir():
    """The folder holding SOURCES: the package's copy, else the source tree's core/."""
    for base in (_PACKAGED, os.path.join(_ROOT, "core")):
        if all(os.path.isfile(os.path.join(base, s)) for s in SOURCES):
            return base
    raise errors.InternalError(
        "the sources of the transport plugins (mpi, gpi2) are missing from this installation "
        f"(looked in {_PACKAGED} and {os.path.join(_ROOT, 'core')}): reinstall Tarantella")


def abi_version(src=None):
    """The plugin ABI version of the core these sources belong to."""
    with open(os.path.join(src or source_dir(), "src", "transport_plugin.h")) as f:
        return int(re.search(r"#define TNT_PLUGIN_ABI_VERSION (\d+)", f.read()).group(1))


def find_mpicc():
    """The MPI compiler wrapper as an argument list, or raise saying why there is none."""
    cmd = build_cache.compiler_from_environment(
        ("TNT_MPICC", "MPICC"), "the mpi transport: {var}={value} is not an executable compiler wrapper: point "
        "{var} at your MPI's mpicc, or unset it to use the mpicc on PATH")
    if cmd is not None:
        return cmd
    found = shutil.which("mpicc")
    if not found:
        transport = os.environ.get("TNT_TRANSPORT", "").strip() or "auto"
        # auto comes here for ranks that the placement puts on several hosts (spans_hosts)
        why = "TNT_TRANSPORT=mpi" if transport == "mpi" else \
            f"TNT_TRANSPORT={transport} needs the mpi transport between hosts (the placement puts the ranks on several)"
        raise errors.InvalidArgumentError(
            f"{why}, but no MPI was found: there is no mpicc on PATH (nor TNT_MPICC / MPICC). Install an "
            "MPI with its development files (Debian/Ubuntu: apt-get install libopenmpi-dev; a cluster: module load "
            f"openmpi), or use TNT_TRANSPORT=shm on one host. Received: TNT_TRANSPORT={transport}, "
            f"PATH={os.environ.get('PATH', '')}")
    return [found]


def _run(cmd, **kw):
    return build_cache.run(cmd, "the mpi transport", **kw)


def describe_mpi(mpicc):
    """What identifies the MPI behind `mpicc`: its version macros and compile line."""
    show = _run([*mpicc, "-show"])
    probe = _run([*mpicc, "-E", "-dM", "-x", "c", "-"], input="#include <mpi.h>\n")
    if probe.returncode != 0:
        raise errors.SystemError(
            f"the mpi transport: {' '.join(mpicc)} cannot compile against mpi.h (are the MPI development files "
            f"installed? Debian/Ubuntu: libopenmpi-dev):\n{(probe.stderr or probe.stdout).strip()[-2000:]}")
    macros = {}
    for line in probe.stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0] == "#define" and parts[1] in _VERSION_MACROS:
            macros[parts[1]] = parts[2].strip().strip('"')
    if "OMPI_MAJOR_VERSION" in macros:
        name = "openmpi-{OMPI_MAJOR_VERSION}.{OMPI_MINOR_VERSION}.{OMPI_RELEASE_VERSION}".format(**macros)
    elif "I_MPI_VERSION" in macros:
        name = "intelmpi-" + macros["I_MPI_VERSION"]
    elif "MVAPICH2_VERSION" in macros:
        name = "mvapich2-" + macros["MVAPICH2_VERSION"]
    elif "MPICH_VERSION" in macros:
        name = "mpich-" + macros["MPICH_VERSION"]
    else:
        name = "mpi-{}.{}".format(macros.get("MPI_VERSION", "x"), macros.get("MPI_SUBVERSION", "x"))
    return {"name": re.sub(r"[^A-Za-z0-9.-]+", "_", name), "macros": macros,
            "wrapper": os.path.realpath(shutil.which(mpicc[0])), "args": mpicc[1:],
            "show": show.stdout.strip() if show.returncode == 0 else ""}


def cache_root():
    return build_cache.cache_root()


def _private_dir(path):
    build_cache.private_dir(path, "the transport plugin", "TNT_MPI_PLUGIN / TNT_GPI2_PLUGIN to a plugin built elsewhere")


def _digest(src, source, compiler):
    """What names a plugin's folder: a digest of its `source` and the HEADERS
    (under `src`) and of `compiler` (a dict describing the compiler)."""
    digest = hashlib.sha256()
    for rel in (source,) + HEADERS:
        with open(os.path.join(src, rel), "rb") as f:
            digest.update(rel.encode() + b"\0" + f.read())
    digest.update(json.dumps(compiler, sort_keys=True).encode())
    return digest.hexdigest()[:12]


def _compile_command(compiler, src, out, source, *libraries):
    return [*compiler, "-std=gnu11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall",
            "-I", os.path.join(src, "include"), "-I", os.path.join(src, "src"),
            os.path.join(src, source), "-o", out, "-lpthread", *libraries]


def build_dir(mpi, src):
    return os.path.join(cache_root(), f"mpi-{mpi['name']}-abi{abi_version(src)}-{_digest(src, _MPI_SOURCE, mpi)}")


def compile_command(mpicc, src, out):
    return _compile_command(mpicc, src, out, _MPI_SOURCE)


def mpi_plugin():
    """The path of the mpi transport's plugin for the MPI found now, built if
    needed; raises a TarantellaError that says why when there can be none."""
    mpicc = find_mpicc()
    src = source_dir()
    mpi = describe_mpi(mpicc)
    return _plugin(mpicc, mpi, src, build_dir(mpi, src), LIBRARY)


def _plugin(compiler, described, src, folder, library, command=compile_command, name="mpi"):
    """`folder`/`library`, built by `command(compiler, src, out)` unless it is
    there (`described` describes the compiler in the build log), and checked
    to be this user's alone."""
    lib = os.path.join(folder, library)
    _private_dir(folder)
    if not os.path.isfile(lib):
        failure = f"TNT_TRANSPORT={name}, but building the {name} transport plugin with {' '.join(compiler)} failed"
        build_cache.build_once(folder, library, command(compiler, src, "{out}"), failure,
                               log_note=f"{name.upper()}: {json.dumps(described, sort_keys=True)}")
    build_cache.check_owned(lib)
    return lib


# ---- gpi2: compiled with the plain C compiler; GPI-2 is found when the transport starts ----

def find_cc():
    """The C compiler for the gpi2 plugin as an argument list, or raise saying why there is none."""
    cmd = build_cache.compiler_from_environment(
        ("TNT_CC", "CC"), "the gpi2 transport: {var}={value} is not an executable C compiler: point {var} at "
        "one, or unset it to use cc on PATH")
    if cmd is not None:
        return cmd
    found = shutil.which("cc") or shutil.which("gcc")
    if not found:
        raise errors.InvalidArgumentError(
            "TNT_TRANSPORT=gpi2, but there is no C compiler (cc) to build the gpi2 transport's plugin with (it is "
            "compiled once, at first use): install one (Debian/Ubuntu: apt-get install gcc), set TNT_CC, or set "
            "TNT_GPI2_PLUGIN to a plugin built elsewhere. Received: "
            f"TNT_TRANSPORT={os.environ.get('TNT_TRANSPORT', '').strip() or 'auto'}, PATH={os.environ.get('PATH', '')}")
    return [found]


def gpi2_compile_command(cc, src, out):
    return _compile_command(cc, src, out, _GPI2_SOURCE, "-ldl")


def gpi2_plugin():
    """The path of the gpi2 transport's plugin, built if needed (it holds no
    GPI-2: the plugin finds GPI-2 when the transport starts and says so if not)."""
    cc = find_cc()
    src = source_dir()
    compiler = {"cc": os.path.realpath(shutil.which(cc[0])), "args": cc[1:]}
    folder = os.path.join(cache_root(), f"gpi2-abi{abi_version(src)}-{_digest(src, _GPI2_SOURCE, compiler)}")
    return _plugin(cc, compiler, src, folder, GPI2_LIBRARY, command=gpi2_compile_command, name="gpi2")


_BUILDERS = {"mpi": ("TNT_MPI_PLUGIN", mpi_plugin), "gpi2": ("TNT_GPI2_PLUGIN", gpi2_plugin)}


# (size, ranks on this host) as the core reads them (core/src/params.c): the launcher's first,
# Slurm's last (engine_ranks.py says why)
_PLACEMENT = (("TNT_SIZE", "TNT_LOCAL_SIZE"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
              ("PMI_SIZE", "MPI_LOCALNRANKS"), ("SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"))


def spans_hosts(environ=None):
    """True when the placement says the ranks are on several hosts (auto then needs mpi)."""
    environ = os.environ if environ is None else environ
    for size_var, local_var in _PLACEMENT:
        size = environ.get(size_var, "").strip()
        if not size:
            continue
        local = environ.get(local_var, "").strip()
        if size_var == "SLURM_NTASKS":  # the step's tasks on this node, as the core counts them
            local = str(engine_ranks.slurm_local_size(environ) or local)
        return size.isdigit() and local.isdigit() and 0 < int(local) < int(size)
    return False


def prepare(transport=None):
    """Before the core starts: make the plugin of a run-time transport available
    (mpi, gpi2; auto when the ranks are on several hosts: mpi between them, or gpi2 when
    gaspi_run started them).
    A no-op for shm and auto on one host, and when TNT_<NAME>_PLUGIN is already set."""
    transport = transport if transport is not None else os.environ.get("TNT_TRANSPORT", "auto").strip()
    if transport == "auto" and os.environ.get("GASPI_RANK") and not os.environ.get("TNT_RANK"):
        # started by gaspi_run: the core takes gpi2 across hosts (and shm on one host, which
        # the machine file may tell only the core: the plugin is made ready either way)
        transport = "gpi2" if os.environ.get("GASPI_NRANKS", "1").strip() not in ("", "1") else "auto"
    elif transport == "auto" and spans_hosts():
        transport = "mpi"
    if transport not in _BUILDERS:
        return None
    var, build = _BUILDERS[transport]
    if os.environ.get(var):
        return None
    path = build()
    os.environ[var] = path
    return path
