"""bench/device_memory.py, the GPU check's memory phase (issue 45): its arithmetic on a GPU's
summaries, and a run of the whole script on the CPU against the build (LOCKSTEP_BUILD_DIR, which
CTest sets), where it measures the peak RSS instead of the device."""

import io
import json
import os
import subprocess
import sys
import types
from contextlib import redirect_stdout

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import device_memory  # noqa: E402

GIB = 2**30


def gpu_run(planned, baseline, peak, step_s, activations=GIB):
    return {"summary": {"planned_worker_bytes": planned, "activation_bytes": activations,
                        "peak_rss_bytes": 1,
                        "device_memory": [{"device": 0, "total_bytes": 140 * GIB,
                                           "baseline_bytes": baseline, "peak_bytes": peak}]},
            "step_s": step_s, "nvml_mib": (peak + 10 * 2**20) / 2**20}


def test_the_ratio_is_what_the_run_added_to_the_gpu_against_the_plan_times_its_workers():
    args = types.SimpleNamespace(device="cuda", config="configs/gpt2_124m.yaml", batch=8)
    ctx = GIB // 2  # the CUDA context: in the baseline, not in the plan
    rows = [("recompute none", 1, gpu_run(8 * GIB, ctx, ctx + int(8.4 * GIB), 0.060)),
            ("recompute selective", 1, gpu_run(6 * GIB, ctx, ctx + int(7.0 * GIB), 0.063)),
            ("recompute full", 1, gpu_run(2 * GIB, ctx, ctx + int(2.1 * GIB), 0.084)),
            ("zero 2, N 2, full", 2, gpu_run(2 * GIB, ctx, ctx + int(4.2 * GIB), 0.150)),
            ("zero 0, N 2, full", 2, {"error": "exit 1: out of memory"}),
            ("comm nccl, recompute full", 1, gpu_run(2 * GIB, ctx, ctx + int(3.0 * GIB), 0.083))]
    rows[0][2]["summary"]["communicator"] = "peer: one process's workers over device memory"
    rows[-1][2]["summary"]["communicator"] = "nccl: a GPU per worker"
    out = io.StringIO()
    with redirect_stdout(out):
        device_memory.report(args, rows)
    lines = [l[len("device_memory: "):] for l in out.getvalue().splitlines()
             if l.startswith("device_memory: ")]
    assert lines == [
        "recompute none: plan 8.00 GiB, measured 8.40 GiB = 1.050x (goal within 10%: met), "
        "60.0 ms/step (peer); NVML +10 MiB against the driver's peak",
        "recompute selective: plan 6.00 GiB, measured 7.00 GiB = 1.167x (goal within 10%: NOT "
        "MET), 63.0 ms/step (+5.0% vs none, goal <= +8%: met); NVML +10 MiB against the "
        "driver's peak",
        "recompute full: plan 2.00 GiB, measured 2.10 GiB = 1.050x (goal within 10%: met), "
        "84.0 ms/step (+40.0% vs none, goal <= +35%: NOT MET); NVML +10 MiB against the "
        "driver's peak",
        "zero 2, N 2, full: plan 4.00 GiB, measured 4.20 GiB = 1.050x (goal within 10%: met), "
        "150.0 ms/step; NVML +10 MiB against the driver's peak",
        # not a recompute mode: no cost against none
        "comm nccl, recompute full: plan 2.00 GiB, measured 3.00 GiB = 1.500x (NCCL's one-rank "
        "communicator, which the plan leaves out), 83.0 ms/step (nccl); NVML +10 MiB against the driver's peak"]
    assert "| zero 0, N 2, full | failed: exit 1: out of memory |" in out.getvalue()
    # NVML saw the whole GPU's use 10 MiB above the driver's peak.
    assert "| recompute none | 1.00 | 8.00 | 8.40 | 1.050 | 0.50 | +10 | 60.0 | +0.0% |" in \
        out.getvalue()


def test_the_script_runs_on_the_cpu(tmp_path):
    build = os.environ.get("LOCKSTEP_BUILD_DIR")
    if not build or not os.path.exists(os.path.join(build, "lockstep")):
        pytest.skip("no LOCKSTEP_BUILD_DIR with a lockstep binary (CTest sets it)")
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "device_memory.py"), "--build", build,
         "--device", "cpu", "--config", "configs/gpt_tiny.yaml", "--batch", "2", "--warmup", "1",
         "--steps", "2", "--set", "data.dataset=tokens", "--set", "model.vocab_size=50257",
         "--logs", str(tmp_path)], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [l for l in done.stdout.splitlines() if l.startswith("device_memory: ")]
    assert [l.split(":")[1].strip() for l in lines] == [
        "recompute none", "recompute selective", "recompute full", "zero 0, N 2, full",
        "zero 2, N 2, full"]
    summary = json.loads((tmp_path / "device_memory_recompute_full.json").read_text())
    assert summary["device_memory"] == [] and summary["peak_rss_bytes"] > 0
    assert summary["planned_worker_bytes"] > summary["activation_bytes"] > 0
