"""Shared by the Python module's tests (run from CTest: tests/CMakeLists.txt sets PYTHONPATH to
the build tree's python/, LOCKSTEP_CLI to the `lockstep` binary and LOCKSTEP_SOURCE_DIR)."""

import json
import os
import subprocess

import pytest

SOURCE_DIR = os.environ.get("LOCKSTEP_SOURCE_DIR",
                            os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
CLI = os.environ.get("LOCKSTEP_CLI", "")


def mlp_config(**trainer):
    """A small MLP on synthetic data: 2 workers, 40 steps, logs every 10."""
    return {
        "model": {"type": "mlp", "hidden": [16]},
        "data": {"dataset": "synthetic", "samples": 512, "features": 8, "classes": 4,
                 "batch_size": 16, "eval_fraction": 0.25, "normalize": True},
        "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9},
        "trainer": {"devices": 2, "steps": 40, "log_every": 10, "seed": 3,
                    "check_replicas_every": 20, **trainer},
    }


def write_yaml(path, values):
    """A config file for the CLI (JSON is YAML)."""
    path.write_text(json.dumps(values, indent=2))
    return str(path)


def run_cli(*args, cwd=None):
    """Runs the `lockstep` binary; returns (exit code, stdout, stderr)."""
    if not CLI:
        pytest.fail("LOCKSTEP_CLI is not set (run these tests through CTest)")
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                       timeout=240)
    return r.returncode, r.stdout, r.stderr


def cli_summary(tmp_path, config_path, *args):
    """`lockstep train CONFIG ARGS --summary-json`: the summary as a dict."""
    out = tmp_path / f"summary-{len(list(tmp_path.glob('summary-*')))}.json"
    code, stdout, stderr = run_cli("train", config_path, "--summary-json", out, *args)
    assert code == 0, stdout + stderr
    return json.loads(out.read_text())
