"""The Python module's overhead: the same training run through `lockstep train` and through
`lockstep.Trainer` (with an on_step callback, as a pipeline would use it), alternated, so that a
busy machine slows both alike. Reports the median samples/s of each and their ratio, per config.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [--pairs 5] [--build build]

The run's samples/s is the summary's (the training loop, first step to last), the same field for
both. The Python side also reports its wall time around run(), which adds the set-up (the data
loaded again, the replicas made) that the CLI's samples/s leaves out too.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import lockstep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cli_run(cli, config, overrides, out):
    args = [cli, "train", config, "--summary-json", out]
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    subprocess.run(args, check=True, capture_output=True, text=True)
    with open(out) as f:
        return json.load(f)["samples_per_s"]


def python_run(config, overrides):
    trainer = lockstep.Trainer(lockstep.Config.from_yaml(config, overrides=overrides))
    logged = []
    trainer.on_step(logged.append)
    start = time.perf_counter()
    summary = trainer.run()
    return summary.samples_per_s, time.perf_counter() - start, len(logged)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = parser.parse_args()
    cli = os.path.join(args.build, "lockstep")
    # The quickstart as shipped (no checkpoints); gpt_tiny cut to 60 steps, logging every 10.
    cases = [
        ("quickstart", os.path.join(ROOT, "configs", "quickstart.yaml"), {}),
        ("gpt_tiny (60 steps)", os.path.join(ROOT, "configs", "gpt_tiny.yaml"),
         {"trainer.steps": 60, "trainer.log_every": 10, "trainer.eval_every": 0,
          "trainer.checkpoint.dir": ""}),
    ]
    print(f"CPU: {cpu_name()}, {os.cpu_count()} threads; load average {os.getloadavg()[0]:.1f}; "
          f"Python {platform.python_version()}, lockstep {lockstep.__version__}")
    print("| config | CLI samples/s | Python samples/s | Python / CLI | callbacks per run |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "summary.json")
        for name, config, overrides in cases:
            cli_rates, py_rates, calls = [], [], 0
            for _ in range(args.pairs):
                cli_rates.append(cli_run(cli, config, overrides, out))
                rate, _, calls = python_run(config, overrides)
                py_rates.append(rate)
            c, p = statistics.median(cli_rates), statistics.median(py_rates)
            print(f"| {name} | {c:,.0f} | {p:,.0f} | {p / c:.3f} | {calls} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
