"""The C core on its own: builds core/ with its Makefile (as a user without
Python would) and runs the C test programs: plainly, the multi-rank one also
under valgrind where it is installed (leaks, invalid accesses, uninitialized
reads in the engine, the negotiation and the shm transport), and every program
under AddressSanitizer + UndefinedBehaviorSanitizer (`make -C core asan`) and
ThreadSanitizer (`make -C core tsan`).

test_edges (core/test/test_edges.c) has one test function per case, each run in
the three builds: the cases were written against reported defects of the core
(see the comment above each case in the C file), so each one names its own."""
import os
import shutil
import subprocess

import pytest

from core_helpers import clean_env

CORE = os.path.join(os.path.dirname(__file__), "..", "..", "core")
PROGRAMS = ["test_core", "test_half", "test_ranks", "test_edges", "test_nccl", "test_nccl_gpu", "test_gpu_staging",
            "test_wedge_watch"]
NCCL_STAND_INS = ["ok", "old", "partial", "dup", "async-error", "hang"]  # core/Makefile's STANDINS
CUDART_STAND_INS = ["ok", "busy", "broken", "so12", "async"]  # core/Makefile's CUDARTS
BUILDS = ["plain", "asan", "tsan"]
pytestmark = pytest.mark.skipif(not shutil.which("make") or not shutil.which("cc"),
                                reason="needs make and a C compiler")


def make(*args):
    return subprocess.run(["make", "-C", CORE, *args], capture_output=True, text=True)


def sanitizer_probe(kind, out):
    """None when the compiler builds and links a threaded program with the
    sanitizer flags of `make SANITIZE=kind`, else why not."""
    cflags = make("-s", f"SANITIZE={kind}", "print-cflags").stdout.split()
    res = subprocess.run(["cc", *cflags, "-x", "c", "-", "-o", str(out / "probe"), "-lpthread"],
                         input="#include <pthread.h>\nint main(void) { return pthread_self() == 0; }\n",
                         capture_output=True, text=True)
    if res.returncode == 0:
        return None
    lines = (res.stderr.strip() or "no output").splitlines()
    return f"cc cannot build with {' '.join(f for f in cflags if f.startswith('-fsanitize'))}: {lines[0]}"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """builds(kind) -> the folder of that build's programs (built once), or skip."""
    made = {}

    def get(kind):
        if kind not in made:
            out = tmp_path_factory.mktemp(f"core-{kind}")
            why_not = sanitizer_probe(kind, out) if kind != "plain" else None
            if why_not is None:
                args = [f"BUILD={out}", *(f"{out}/{p}" for p in PROGRAMS)]
                if kind == "plain":
                    args.append(f"{out}/libtarantella.so")
                    args += [f"{out}/nccl-{v}.so" for v in NCCL_STAND_INS]
                    args += [f"{out}/cudart-{v}.so" for v in CUDART_STAND_INS]
                else:
                    args.append(f"SANITIZE={kind}")
                res = make(*args)
                assert res.returncode == 0, res.stdout + res.stderr
            made[kind] = (out, why_not)
        out, why_not = made[kind]
        if why_not:
            pytest.skip(why_not)
        return out

    return get


@pytest.fixture(scope="module")
def build(builds):
    return builds("plain")


def run(cmd, **env):
    res = subprocess.run(cmd, env=clean_env(**env), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.mark.parametrize("kind", BUILDS)
def test_c_core_program(builds, kind):
    assert run([str(builds(kind) / "test_core")]).stdout.strip().endswith("0 failed")


@pytest.mark.parametrize("kind", BUILDS)
def test_c_half_program(builds, kind):
    # the vector float16/bfloat16 kernels against the scalar code, bit for bit
    assert run([str(builds(kind) / "test_half")]).stdout.strip().endswith(" 0 failed")


@pytest.mark.parametrize("kind", BUILDS)
@pytest.mark.parametrize("n", [2, 3, 4])  # 3: the direct allreduce, 2 and 4: the ring (test_ranks.c)
def test_c_ranks_program(builds, kind, n):
    assert run([str(builds(kind) / "test_ranks"), str(n)]).stdout.strip() == f"{n} passed, 0 failed"


@pytest.mark.parametrize("kind", BUILDS)
def test_wedge_watch_ends_a_process_stuck_after_a_peer_died(builds, kind):
    """core/test/test_wedge_watch.c: a process whose plugin lock stays taken while a local peer's
    process is gone (a thread stuck for good inside Open MPI) ends itself within seconds with exit
    code 70, naming the dead rank; a lock freed between polls, or held while every peer lives, is
    left alone; the watch stops at once."""
    assert run([str(builds(kind) / "test_wedge_watch")]).stdout.strip() == "9 passed, 0 failed"


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is not installed")
def test_c_ranks_program_under_valgrind(build):
    res = run(["valgrind", "-q", "--leak-check=full", "--errors-for-leak-kinds=definite",
               "--error-exitcode=3", "--trace-children=yes", str(build / "test_ranks"), "2"])
    assert res.stdout.strip() == "2 passed, 0 failed"
    assert "==" not in res.stderr, res.stderr  # valgrind -q prints nothing unless it found something


def test_nccl_loader_against_stand_in_libraries(build):
    """core/test/test_nccl.c: a missing, old or incomplete libnccl.so.2 is refused saying why and what to
    install; a failed or never-ending communicator set-up is aborted with NCCL's own words or at the
    deadline; a working one is non-blocking. The collectives pass NCCL every dtype's and op's code,
    refuse an integer average, and wait for their stream with the deadline: a stream that never gets
    there or fails aborts the communicator, and every later call fails at once naming why; a missing
    CUDA runtime says what to install; the runtime the process has loaded (TensorFlow's .so.12) is taken
    before a .so.13 on the library path. No GPU: the libraries are stand-ins built by core/Makefile."""
    res = run([str(build / "test_nccl"), str(build)])
    assert res.stdout.strip().splitlines()[-1] == "12 passed, 0 failed", res.stdout + res.stderr


def test_nccl_collectives_on_a_gpu(build):
    """core/test/test_nccl_gpu.c with the real NCCL and CUDA runtime: every collective and dtype on a
    one-rank communicator, a stream that never gets to the collective, a rank that never joins, two
    ranks on one GPU (refused by NCCL). It says why it skips where there is no GPU (every CI machine);
    core/test/run_on_gpu.sh runs it on a machine with one (figures: docs/gpus.md)."""
    res = run([str(build / "test_nccl_gpu")])
    if res.stdout.startswith("skipped: "):
        pytest.skip(res.stdout.strip().splitlines()[0])
    assert res.stdout.strip().splitlines()[-1] == "4 passed, 0 failed", res.stdout + res.stderr


@pytest.mark.parametrize("kind", BUILDS)
def test_gpu_staging_pipeline_over_a_stand_in(builds, build, kind):
    """core/test/test_gpu_staging.c on 3 ranks, the CUDA runtime a stand-in whose "GPU" is host memory
    and whose streams run their copies later, in order, each on a thread (cudart-async; cudart-ok did
    each copy as it was queued, so no order of the streams was tested): the pieces, buffers and events
    of host staging (src/gpu/staging.c) give every dtype, size (one element to several pieces),
    in-place or not, sum or average the bits of the host allreduce, and touch nothing past the result.
    On a GPU core/test/run_on_gpu.sh runs it for real (docs/gpus.md)."""
    res = run([str(builds(kind) / "test_gpu_staging"), "3"], TNT_STAGING_ON_HOST=1,
              TNT_CUDART_LIBRARY=build / "cudart-async.so")
    assert res.stdout.strip().splitlines()[-1] == "3 passed, 0 failed", res.stdout + res.stderr
    # a call failing part-way (its last piece a mismatch) left its copies queued: they landed in its
    # buffer after it had returned, while the next call's copies out reused their pinned buffers
    res = run([str(builds(kind) / "test_gpu_staging"), "2", "--failed"], TNT_STAGING_ON_HOST=1,
              TNT_CUDART_LIBRARY=build / "cudart-async.so", STANDIN_COPY_DELAY_US=20000)
    assert res.stdout.strip().splitlines()[-1] == "2 passed, 0 failed", res.stdout + res.stderr
    # ranks that stage different counts (one piece on rank 0, two on rank 1) all fail at TNT_TIMEOUT_S=3,
    # naming the pieces: rank 0 returned a success before, the others waiting for their second piece
    res = run([str(builds(kind) / "test_gpu_staging"), "2", "--unequal"], TNT_STAGING_ON_HOST=1,
              TNT_CUDART_LIBRARY=build / "cudart-ok.so")
    assert res.stdout.strip().splitlines()[-1] == "2 passed, 0 failed", res.stdout + res.stderr
    assert "'unequal#0/1' was submitted on rank 0" in res.stdout and "'unequal#0/2'" in res.stdout, res.stdout
    # two threads per rank staging at once, begun in another order on each rank: the calls of a process
    # took turns (one set of pinned buffers), and each rank's first call waited for the other's first,
    # which waited behind its second, until TNT_TIMEOUT_S (10 s here)
    res = run([str(builds(kind) / "test_gpu_staging"), "2", "--threads"], TNT_STAGING_ON_HOST=1,
              TNT_CUDART_LIBRARY=build / "cudart-async.so")
    assert res.stdout.strip().splitlines()[-1] == "2 passed, 0 failed", res.stdout + res.stderr


def test_gpu_staging_says_why_it_skips_without_a_gpu(build):
    res = run([str(build / "test_gpu_staging"), "2"])
    if not res.stdout.startswith("skipped: "):
        assert res.stdout.strip().splitlines()[-1] == "2 passed, 0 failed", res.stdout + res.stderr
        return  # a machine with a GPU ran it for real
    assert res.stdout.splitlines() == [res.stdout.splitlines()[0]] * 2  # each rank said why, nothing else


# ---- test_edges: one function per case (the expected behaviour is in core/test/test_edges.c) ----

def edge_case(builds, kind, case):
    res = run([str(builds(kind) / "test_edges"), case])
    assert res.stdout.strip().splitlines()[-1] == "1 passed, 0 failed", res.stdout + res.stderr


def test_every_edge_case_has_a_test_here(build):
    cases = run([str(build / "test_edges"), "--list"]).stdout.split()
    assert sorted(cases) == sorted(n[len("test_edges_"):] for n in globals() if n.startswith("test_edges_"))


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_two_waiters(builds, kind):
    edge_case(builds, kind, "two_waiters")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_release_while_waiting(builds, kind):
    edge_case(builds, kind, "release_while_waiting")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_generation_2_31(builds, kind):
    edge_case(builds, kind, "generation_2_31")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_generation_2_32(builds, kind):
    edge_case(builds, kind, "generation_2_32")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_finalize_while_waiting(builds, kind):
    edge_case(builds, kind, "finalize_while_waiting")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_wait_timeout(builds, kind):
    edge_case(builds, kind, "wait_timeout")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_wait_forever(builds, kind):
    edge_case(builds, kind, "wait_forever")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_fork_child_collective(builds, kind):
    edge_case(builds, kind, "fork_child_collective")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_fork_child_exit(builds, kind):
    edge_case(builds, kind, "fork_child_exit")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_fork_child_before_init(builds, kind):
    edge_case(builds, kind, "fork_child_before_init")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_root_leaves_after_broadcast(builds, kind):
    edge_case(builds, kind, "root_leaves_after_broadcast")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_diverged_in_a_bit_round(builds, kind):
    edge_case(builds, kind, "diverged_in_a_bit_round")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_shapes_that_differ(builds, kind):
    edge_case(builds, kind, "shapes_that_differ")


@pytest.mark.parametrize("kind", BUILDS)
def test_edges_leftover_host_marks(builds, kind):
    edge_case(builds, kind, "leftover_host_marks")
