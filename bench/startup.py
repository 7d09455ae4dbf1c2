"""Start-up: the wall time from launching a job to the end of its first
training step, plain Keras against tntrun, side by side in interleaved rounds.

    python bench/startup.py                  # 5 rounds of every setup
    python bench/startup.py --rounds 9 --setups keras,tnt2
    python bench/startup.py --before /tmp/before   # adds tnt2-before: another source tree

Setups (a tiny Keras MLP trained with fit() on NumPy arrays; TF_CPP_MIN_LOG_LEVEL=3):
  keras   plain Keras, `python bench/startup.py --worker keras`, one process
  keras2  two plain-Keras processes started together: the floor of any
          2-process job on this host (two TensorFlow imports share the cores)
  tnt1    `tntrun -n 1 -- bench/startup.py --worker tnt` (tnt.Model)
  tnt2    `tntrun -n 2 -- ...`: the slowest rank's first step counts
  tnt2-before  tnt2 with the Tarantella of the tree given by --before DIR (e.g.
          the commit before a change: `git worktree add DIR COMMIT`, then
          `cp tarantella/_core.abi3.so DIR/tarantella/` and
          `ln -s ../runner DIR/tarantella/runner`), run through PYTHONPATH
A launch's time is from just before the driver starts the command to the end
of the first training step (a callback's on_train_batch_end) of its slowest
process. Every round launches every setup once, in a rotated order; the
figures are medians over the rounds, with the differences and ratios against
plain Keras and against the 2-process floor.

The breakdown comes from TNT_STARTUP_LOG (tarantella/common/startup_log.py):
tntrun, Tarantella and the worker each append when a step of the start-up
happened; for every event the table shows the median time since launch at
which the last process reached it. TensorFlow's import dominates the total
and moves by seconds on a loaded machine, so the time from the end of the
slowest process's imports to its first step is shown too: that is where
Tarantella adds work of its own.
"""
import time

T_PYTHON = time.time()  # first: the worker's "python started" (imports below take time)

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

HERE = os.path.abspath(__file__)
SETUPS = ("keras", "keras2", "tnt1", "tnt2", "tnt2-before")
FIRST_STEP = "worker: first step done"
IMPORTED = "worker: tensorflow and keras imported"


def _mark(event, when=None):
    """The worker's events, in the format of tarantella/common/startup_log.py
    (written here, so that the plain-Keras worker imports no Tarantella)."""
    path = os.environ.get("TNT_STARTUP_LOG")
    if path:
        label = os.environ.get("TNT_RANK", os.environ.get("BENCH_LABEL", "keras"))
        with open(path, "a") as f:
            f.write(f"{label}\t{time.time() if when is None else when:.6f}\t{event}\n")


def worker(kind):
    """Train a tiny model for one step, as a user's script does."""
    _mark("worker: python started", T_PYTHON)
    if kind == "tnt":
        import tarantella as tnt
    import keras
    import numpy as np
    _mark("worker: tensorflow and keras imported")
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    if kind == "tnt":
        model = tnt.Model(model)
    model.compile(optimizer="sgd", loss="mse")
    _mark("worker: model compiled")

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                _mark(FIRST_STEP)

    x = np.random.default_rng(0).standard_normal((256, 16)).astype("float32")
    y = np.zeros((256, 4), "float32")
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[FirstStep()])


def _commands(setup, before):
    me = [sys.executable, HERE, "--worker"]
    if setup == "keras":
        return [(me + ["keras"], {})]
    if setup == "keras2":
        return [(me + ["keras"], {"BENCH_LABEL": f"keras{i}"}) for i in range(2)]
    ranks = {"tnt1": "1", "tnt2": "2", "tnt2-before": "2"}[setup]
    job = ["-n", ranks, "--", HERE, "--worker", "tnt"]
    if setup == "tnt2-before":
        path = os.pathsep.join(p for p in (before, os.environ.get("PYTHONPATH")) if p)
        return [([sys.executable, "-m", "tarantella.runner"] + job, {"PYTHONPATH": path})]
    return [([os.path.join(os.path.dirname(sys.executable), "tntrun")] + job, {})]


def launch(setup, folder, before=None):
    """(seconds to the slowest process's first step, {event: seconds since launch}) of one launch."""
    log = os.path.join(folder, f"{setup}-{time.monotonic_ns()}.log")
    base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TNT_STARTUP_LOG=log)
    base.pop("TNT_RANK", None)
    t0 = time.time()
    procs = [subprocess.Popen(argv, env=dict(base, **extra), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for argv, extra in _commands(setup, before)]
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit(f"{setup} failed (exit status {p.returncode}):\n{out[-3000:]}")
    with open(log) as f:  # tarantella/common/startup_log.py's format (read here: --before trees lack it)
        lines = [line.rstrip("\n").split("\t", 2) for line in f]
    events = {}
    for label, when, event in lines:
        # per event: when the last process reached it (the first time each did)
        events.setdefault(event, {}).setdefault(label, float(when) - t0)
    events = {k: max(v.values()) for k, v in events.items()}
    expected = 1 if setup in ("keras", "tnt1") else 2
    processes = sum(1 for _, _, event in lines if event == FIRST_STEP)
    if processes != expected:
        sys.exit(f"{setup}: {processes} processes reported a first step, expected {expected} ({log})")
    return events[FIRST_STEP], events[FIRST_STEP] - events[IMPORTED], events


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--setups", default=",".join(SETUPS),
                    help=f"comma-separated, of {', '.join(SETUPS)}")
    ap.add_argument("--before", metavar="DIR",
                    help="a source tree whose Tarantella runs as setup tnt2-before (see above)")
    ap.add_argument("--worker", choices=("keras", "tnt"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    setups = [s for s in args.setups.split(",") if s and (s != "tnt2-before" or args.before)]
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown:
        ap.error(f"unknown setup(s) {unknown}: choose from {', '.join(SETUPS)}")
    totals = {s: [] for s in setups}
    tails = {s: [] for s in setups}
    phases = {s: {} for s in setups}
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    with tempfile.TemporaryDirectory(prefix="tnt-startup-") as folder:
        for r in range(args.rounds):
            order = setups[r % len(setups):] + setups[:r % len(setups)]
            for setup in order:
                total, tail, events = launch(setup, folder, args.before)
                totals[setup].append(total)
                tails[setup].append(tail)
                for event, when in events.items():
                    phases[setup].setdefault(event, []).append(when)
            print(f"round {r + 1}: " + ", ".join(f"{s} {totals[s][-1]:.2f} s" for s in setups)
                  + f" (load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"\n# load average {os.getloadavg()[0]:.2f} at the end; medians of {args.rounds} rounds")
    _table("launch to the end of the slowest process's first training step", totals, setups)
    _table("end of the slowest process's imports (TensorFlow, Keras, Tarantella) to its first step",
           tails, setups)
    print("\n# when the last process reached each step (median seconds since launch)\n")
    # in tnt2's order where it has the event, else in the first setup's that has it
    order = sorted(setups, key=lambda s: s != "tnt2")
    events = sorted({e for s in setups for e in phases[s]},
                    key=lambda e: [statistics.median(phases[s][e]) for s in order if e in phases[s]][0])
    print("| step | " + " | ".join(setups) + " |")
    print("| --- |" + " ---: |" * len(setups))
    for e in events:
        cells = [f"{statistics.median(phases[s][e]):.2f}" if e in phases[s] else "" for s in setups]
        print(f"| {e} | " + " | ".join(cells) + " |")


def _table(title, figures, setups):
    med = {s: statistics.median(v) for s, v in figures.items()}
    print(f"\n{title}:\n")
    print("| setup | median | min-max | - keras | / keras | - keras2 (floor) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for s in setups:
        vs_keras = (f"{med[s] - med['keras']:+.2f} s", f"{med[s] / med['keras']:.2f}") \
            if "keras" in med else ("", "")
        vs_floor = f"{med[s] - med['keras2']:+.2f} s" if "keras2" in med else ""
        print(f"| {s} | {med[s]:.2f} s | {min(figures[s]):.2f}-{max(figures[s]):.2f} | "
              f"{vs_keras[0]} | {vs_keras[1]} | {vs_floor} |")


if __name__ == "__main__":
    main()
