"""The README's main command: examples/lenet5_mnist.py on 2 ranks trains to
LeNet-5 accuracy (on MNIST if cached, else scikit-learn's digits)."""
import os
import re

from tf_helpers import REPO, run_ranks


def test_lenet5_example_on_two_ranks():
    result = run_ranks(2, os.path.join(REPO, "examples", "lenet5_mnist.py"))
    assert "data: " in result.stdout
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", result.stdout).group(1))
    assert accuracy >= 0.95, result.stdout[-2000:]
