"""The tutorials' scripts (examples/) run end to end on 2 ranks, one launch
each, with the command their page shows (`<!-- run-by: ... -->`)."""
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import doc_blocks as db

# the exact commands of the tutorial pages (test_code_blocks.py checks it)
COMMANDS = {
    "resnet": "tntrun -n 2 -- examples/resnet.py --epochs 2 --steps 4",
    "transformer": "tntrun -n 2 -- examples/transformer.py --epochs 2 --steps 10",
}


def launch(name, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TNT_", "SLURM_", "OMPI_", "PMI_", "PMIX_"))}
    source = db.launcher_from_source(str(tmp_path / "launcher-bin"))
    env["PATH"] = os.pathsep.join(([source] if source else []) + [
        os.path.dirname(sys.executable), env.get("PATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["TNT_TIMEOUT_S"] = "120"
    os.symlink(os.path.join(db.REPO, "examples"), tmp_path / "examples")
    args = shlex.split(COMMANDS[name])
    args[0] = shutil.which("tntrun", path=env["PATH"])
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


def test_resnet(tmp_path):
    out = launch("resnet", tmp_path)
    # global batch 2 x 32 = 64: learning rate 0.1 x 64 / 256, reached at the end of the warm-up
    assert ("small: 2 rank(s), global batch 64; learning rate 0.025 after 4 warm-up steps"
            in out), out
    rates = [float(r) for r in re.findall(r"epoch \d+: learning rate ([0-9.]+)", out)]
    assert rates == [pytest.approx(0.025), pytest.approx(0.0)], out
    assert "validation accuracy:" in out, out
    checkpoints = sorted(os.listdir(tmp_path / "resnet_run" / "checkpoints"))
    assert checkpoints == ["epoch-001.keras", "epoch-002.keras"]
    if importlib.util.find_spec("tensorboard") is None:
        assert "TensorBoard logs skipped: the tensorboard package is not installed" in out, out
    else:
        assert os.listdir(tmp_path / "resnet_run" / "tensorboard"), "no TensorBoard logs"


def test_transformer(tmp_path):
    out = launch("transformer", tmp_path)
    assert "2 rank(s), global batch 64" in out, out
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", out).group(1))
    assert 0.0 <= accuracy <= 1.0, out
