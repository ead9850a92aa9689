"""examples/python/train_mlp.py, run verbatim as a user runs it."""

import os
import re
import subprocess
import sys

from conftest import SOURCE_DIR


def test_the_example_trains_and_learns():
    example = os.path.join(SOURCE_DIR, "examples", "python", "train_mlp.py")
    r = subprocess.run([sys.executable, example], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [int(s) for s in re.findall(r"^step +(\d+)", r.stdout, re.M)] == [100, 200, 300, 400]
    accuracy = float(re.search(r"eval accuracy ([0-9.]+)", r.stdout).group(1))
    assert accuracy > 0.9, r.stdout
    assert "replicas identical: True" in r.stdout
    assert "leaked" not in r.stderr, r.stderr  # nanobind's count of objects alive at exit


def test_the_readme_shows_the_example_verbatim():
    with open(os.path.join(SOURCE_DIR, "README.md")) as f:
        readme = f.read()
    marker = "<!-- run by tests/python/test_example.py, verbatim -->\n```python\n"
    start = readme.index(marker) + len(marker)
    block = readme[start:readme.index("```\n", start)]
    with open(os.path.join(SOURCE_DIR, "examples", "python", "train_mlp.py")) as f:
        assert block == f.read()
