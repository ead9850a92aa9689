#!/usr/bin/env python3
"""The GPU check: one command that builds lockstep with its CUDA backend, runs the GPU tests and
the GPU phases (benchmarks, fault cases) within a time budget, and brings back one summary and
one archive. See bench/GPU.md for what a run prints and how to read it.

    bash scripts/gpu_check.sh                 # on the GPU machine (the device tool's run)
    bash scripts/gpu_check.sh --rehearse      # here: the whole check with the GPU phases stubbed
    bash scripts/gpu_check.sh --plan          # the order and each phase's budget, nothing run

On the lent GPU machine (one H200, no network, none of our Debian packages; shared/GPU.md):
  1. here, once, from the project root:   bash scripts/fetch_gpu_deps.sh .devdeps
  2. the device tool's run:               command "bash scripts/gpu_check.sh",
                                          carry [".devdeps"], timeout_s 580
  Then give the machine back.

Note [What comes back]
A run on the GPU machine returns at most 8 files from $OUT (16 MiB each, two folders deep) and the
last 12,000 characters of its output. So the check writes exactly two files there, both rewritten
after every phase (a run cut short still returns everything up to its last phase):
  - summary.txt: the table (every phase's status and key figure, the failing tests by name);
  - gpu_check.tar.gz: every log, CSV and JSON the phases wrote.
Logs are written in a scratch folder outside $OUT and checkpoints never leave it. The table is
also printed last, so it is the tail of the output. A phase's figure is in the summary as soon
as the phase ends.

Note [Phase order]
The budget (LOCKSTEP_GPU_BUDGET_S, default 540 s of the device's 600 s per command) is spent in
the order of PHASES: the build, the GPU tests (the cuDNN cases last, as their plans take seconds
to build; the kernels no GPU has run yet are there, each against the CPU device), then the
phases that have changed since they last passed on a GPU (shrink, whose figure the fourth run of
2026-12-04 found wrong; memory, whose one worker no longer makes an NCCL communicator), the three
that run's budget did not reach (faults, two_process, snapshot), then what the runs of 2026-12-04
measured, then what earlier runs measured. Each phase runs under its own cap, cut to what the budget has
left (keeping RESERVE_S for the table and the archive); one that cannot have MIN_START_S does
not start and is listed as "not run". The table's last line names every phase that did not run
(not run, skipped without a GPU, or not reached when the run was cut short), to run next time
with LOCKSTEP_GPU_PHASES.

Note [Rehearsal]
`--rehearse` runs the check here, where no GPU is (CI runs it after scripts/test.sh): the
dependency check unpacks what scripts/fetch_gpu_deps.sh fetched (LOCKSTEP_GPU_DEPS) into a
scratch prefix and the configure runs against that prefix with /usr ignored, as it would run on
the GPU machine, whose image lacks our packages; the build is not made again (the one in
LOCKSTEP_GPU_BUILD, default scripts/test.sh's, stands for it); the GPU tests run there (they
skip, but the filters, the skip count and the parse are real); every GPU phase runs as a stub.
It then lists the files that would come back and fails when they break Note [What comes back].

Environment: OUT (default ./gpu-check-out), LOCKSTEP_GPU_PHASES (names, space-separated, in
order), LOCKSTEP_GPU_BUDGET_S, LOCKSTEP_GPU_BUILD (default build-gpu), LOCKSTEP_GPU_SCRATCH
(logs and checkpoints, default a folder under $TMPDIR), LOCKSTEP_GPU_DEPS (default .devdeps),
LOCKSTEP_DEPS_PREFIX (default /tmp/p), LOCKSTEP_CMAKE_ARGS, NCCL_HOME, CUDNN_ROOT.

Exit status: 0 when the build succeeded, no GPU test failed and every phase that ran passed; 1
otherwise; 2 for a bad argument or phase name.
"""

import argparse
import glob
import importlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESERVE_S = 20      # kept for the table and the archive
MIN_START_S = 30    # a phase that cannot have this long does not start
MAX_FILES = 8       # what the device tool brings back from $OUT (Note [What comes back])
MAX_FILE_BYTES = 16 << 20
ARCHIVE = "gpu_check.tar.gz"
SUMMARY = "summary.txt"


class Phase:
    """One step of the check: `run(check, limit_s)` returns (ok, figure). `expect_s`: what it
    should take on the H200 (a guess until a run measures it), `cap_s`: the most it may take.
    `gpu`: needs a usable GPU."""

    def __init__(self, name, expect_s, cap_s, what, run, gpu=True):
        self.name, self.expect_s, self.cap_s = name, expect_s, cap_s
        self.what, self.run, self.gpu = what, run, gpu


class Result:
    def __init__(self, status, figure="", seconds=0.0):
        self.status, self.figure, self.seconds = status, figure, seconds


def plan(phases, budget_s):
    """(name, start, limit) of each phase in order if every phase takes what it is expected to:
    when it starts and the limit it gets then, its cap cut to what the budget has left; limit 0:
    it would not start (Note [Phase order])."""
    out = []
    t = 0.0
    for p in phases:
        limit = phase_limit(p.cap_s, budget_s - t)
        out.append((p.name, t, limit))
        if limit:
            t += min(p.expect_s, limit)
    return out


def did_not_run(phases, results):
    """The table's last line: every phase that did not run, by why (Note [Phase order])."""
    why = {}
    for p in phases:
        r = results.get(p.name)
        status = "not reached" if r is None else r.status
        if status in ("not reached", "not run", "skipped"):
            why.setdefault(status, []).append(p.name)
    if not why:
        return "did not run   none: every phase ran"
    return "did not run   " + "; ".join(f"{status}: {' '.join(names)}"
                                        for status, names in why.items())


def phase_limit(cap_s, left_s):
    """Seconds a phase capped at `cap_s` may take with `left_s` of the budget left; 0: none."""
    room = left_s - RESERVE_S
    if room < min(MIN_START_S, cap_s):
        return 0
    return int(min(cap_s, room))


# ---- Parsing what the tools print -------------------------------------------------------------

def doctest_failures(log):
    """The names of the cases doctest's console reporter reported failing or crashing (a case
    killed by `timeout` reports SIGTERM as a crash), in order, without repeats."""
    names = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("TEST CASE:"):
            block = "\n".join(lines[i + 1:i + 40])
            # A block ends at the next separator; only failures and crashes print one here.
            block = block.split("=" * 20)[0]
            if re.search(r"(^|: )(ERROR|FATAL ERROR): ", block, re.M):
                name = line[len("TEST CASE:"):].strip()
                if name not in names:
                    names.append(name)
    return names


def doctest_counts(log):
    """(cases run, passed, failed) from doctest's last summary line, or None."""
    found = re.findall(r"\[doctest\] test cases: *(\d+) \| *(\d+) passed \| *(\d+) failed", log)
    return tuple(int(x) for x in found[-1]) if found else None


def skip_counts(path):
    """{kind: count} of the skips tests/skip.hpp logged (Note [Skip kinds])."""
    counts = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                kind = line.split("\t", 1)[0].strip()
                if kind:
                    counts[kind] = counts.get(kind, 0) + 1
    return counts


def first_line(log, pattern, strip=""):
    """The first line of `log` that matches `pattern` (a regex), less the prefix `strip`."""
    for line in log.splitlines():
        if re.search(pattern, line):
            return line[len(strip):] if strip and line.startswith(strip) else line
    return ""


def missing_dependencies(configure_log):
    """The configure's one line of missing build dependencies (CMakeLists.txt), or ""."""
    m = re.search(r"lockstep: missing build dependencies: (.*?)(\n\s*\n|$)", configure_log,
                  re.S)
    return " ".join(m.group(1).split()) if m else ""  # CMake wraps a long message


def dangling_links(prefix):
    """Symbolic links under `prefix` whose target is not there: a library's .so link into a
    runtime package that did not travel (PCRE2's did not, once). Documentation's links into
    packages left behind (gcc's) do not count."""
    broken = []
    for folder, dirs, files in os.walk(prefix):
        if os.path.relpath(folder, prefix).startswith(os.path.join("usr", "share")):
            continue
        for name in files + dirs:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not os.path.exists(path):
                broken.append(os.path.relpath(path, prefix))
    return sorted(broken)


# ---- The check ---------------------------------------------------------------------------------

class Check:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(os.environ.get("OUT", "./gpu-check-out"))
        scratch = os.environ.get("LOCKSTEP_GPU_SCRATCH") or tempfile.mkdtemp(prefix="gpu-check-")
        self.scratch = os.path.abspath(scratch)
        self.logs = os.path.join(self.scratch, "logs")        # archived
        self.work = os.path.join(self.scratch, "work")        # checkpoints: never archived
        for d in (self.out, self.logs, self.work):
            os.makedirs(d, exist_ok=True)
        self.build = os.path.abspath(os.environ.get("LOCKSTEP_GPU_BUILD",
                                                    os.path.join(ROOT, "build-gpu")))
        self.prefix = os.environ.get("LOCKSTEP_DEPS_PREFIX", "/tmp/p")
        # What scripts/fetch_gpu_deps.sh fetched: the .deb files and the cuDNN frontend.
        self.deps = os.path.abspath(os.environ.get("LOCKSTEP_GPU_DEPS",
                                                   os.path.join(ROOT, ".devdeps")))
        # --rehearse configures a folder of its own, and builds nothing (Note [Rehearsal]).
        self.configure_dir = os.path.join(self.scratch, "configure") if args.rehearse \
            else self.build
        self.budget = float(os.environ.get("LOCKSTEP_GPU_BUDGET_S", "540"))
        self.start = time.monotonic()
        self.stub = args.rehearse
        self.env = dict(os.environ)
        self.results = {}
        self.notes = []             # lines for the table's head (GPU, versions, dependencies)
        self.failing_tests = []
        self.gpu = ""               # the probe's line when a GPU is usable
        self.no_gpu = ""            # why not
        self.cmake_args = []
        self.timed_out = False      # the running phase had a command killed at its limit
        self.progress = open(os.path.join(self.logs, "gpu_check.log"), "a")

    # -- helpers --
    def elapsed(self):
        return time.monotonic() - self.start

    def say(self, text):
        line = f"gpu_check: {text}"
        print(line, flush=True)
        self.progress.write(line + "\n")
        self.progress.flush()

    def log_path(self, name):
        return os.path.join(self.logs, name)

    def run(self, name, cmd, limit_s, env=None, log=None):
        """Runs `cmd` (a list) with its output in logs/`log` (default NAME.log), killed with its
        whole process group after `limit_s`. Returns (status, output); status 124: timed out."""
        path = self.log_path(log or f"{name}.log")
        full_env = dict(self.env)
        full_env.update(env or {})
        with open(path, "a") as f:
            f.write(f"$ {shlex.join(str(c) for c in cmd)}\n")
            f.flush()
            try:
                proc = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                                        cwd=ROOT, env=full_env, start_new_session=True)
            except OSError as e:
                f.write(f"cannot start: {e}\n")
                return 127, f"cannot start: {e}"
            try:
                status = proc.wait(timeout=max(1, limit_s))
            except subprocess.TimeoutExpired:
                kill_group(proc)
                status = 124
                self.timed_out = True
                f.write(f"\ngpu_check: killed after {limit_s} s\n")
        with open(path, errors="replace") as f:
            return status, f.read()

    def stubbed(self, name, limit_s):
        """--rehearse: what a GPU phase would run, replaced by a command that prints its name."""
        return self.run(name, [sys.executable, "-c", f"print('rehearsal: {name} stubbed')"],
                        limit_s)

    # -- the summary and the archive (Note [What comes back]) --
    def table(self):
        rows = [f"==== lockstep GPU check, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, "
                f"{self.elapsed():.0f} s of {self.budget:.0f} s" +
                (" (REHEARSAL: GPU phases stubbed)" if self.stub else "") + " ===="]
        rows.append(f"GPU           {self.gpu or ('none: ' + self.no_gpu if self.no_gpu else '?')}")
        rows += self.notes
        for p in self.phases:
            r = self.results.get(p.name)
            if r is None:
                continue
            head = f"{p.name:<14}{r.status}"
            if r.seconds:
                head += f" ({r.seconds:.0f} s)"
            # A figure of several lines (a phase's table) goes on under the row, indented.
            rows.append(head + (": " + r.figure.replace("\n", "\n" + " " * 14)
                                if r.figure else ""))
        if self.failing_tests:
            rows.append("failing GPU tests:")
            rows += [f"  {t}" for t in self.failing_tests]
        rows.append(f"logs          {ARCHIVE} (in $OUT), {SUMMARY}")
        rows.append(did_not_run(self.phases, self.results))
        return "\n".join(rows)

    def save(self):
        """Rewrites summary.txt and the archive in $OUT, each whole or not at all."""
        text = self.table() + "\n"
        write_atomic(os.path.join(self.out, SUMMARY), text.encode())
        with open(self.log_path(SUMMARY), "w") as f:
            f.write(text)
        self.progress.flush()
        tmp = os.path.join(self.scratch, ARCHIVE)
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(glob.glob(os.path.join(self.logs, "*"))):
                if os.path.isfile(path):
                    add_capped(tar, path, os.path.join("gpu_check", os.path.basename(path)))
        shutil.copyfile(tmp, os.path.join(self.out, ARCHIVE + ".part"))
        os.replace(os.path.join(self.out, ARCHIVE + ".part"), os.path.join(self.out, ARCHIVE))

    def record(self, phase, status, figure="", seconds=0.0):
        self.results[phase.name] = Result(status, figure, seconds)
        self.say(f"{phase.name}: {status}" + (f": {figure}" if figure else ""))
        self.save()

    # -- the loop --
    def execute(self):
        failed = False
        self.save()
        for p in self.phases:
            left = self.budget - self.elapsed()
            limit = phase_limit(p.cap_s, left)
            if p.gpu and not self.gpu and not self.stub:
                self.record(p, "skipped", "no usable GPU" + (f": {self.no_gpu}" if self.no_gpu
                                                             else ""))
                continue
            if limit == 0:
                self.record(p, "not run", f"budget spent ({left:.0f} s left, cap {p.cap_s} s)")
                continue
            self.say(f"{p.name}: running (at most {limit} s): {p.what}")
            t0 = time.monotonic()
            self.timed_out = False
            try:
                ok, figure = p.run(self, limit)
            except Exception as e:  # a phase's own bug must not lose the others' results
                ok, figure = False, f"gpu_check error: {type(e).__name__}: {e}"
            seconds = time.monotonic() - t0
            status = "ok" if ok else ("TIMED OUT" if self.timed_out else "FAILED")
            failed = failed or not ok
            self.record(p, status, figure, seconds)
        return failed


def kill_group(proc):
    """SIGTERM to `proc`'s process group (doctest then names the case it was in), SIGKILL after
    5 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def write_atomic(path, data):
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


MAX_LOG_BYTES = 4 << 20


def add_capped(tar, path, name):
    """Archives `path` as `name`; a log over MAX_LOG_BYTES keeps its last MAX_LOG_BYTES (where a
    failure is) under a name that says so: the archive must stay under the 16 MiB a file may have
    to come back, or a runaway log would lose every other."""
    size = os.path.getsize(path)
    if size <= MAX_LOG_BYTES:
        tar.add(path, arcname=name)
        return
    with open(path, "rb") as f:
        f.seek(size - MAX_LOG_BYTES)
        data = f.read(MAX_LOG_BYTES)
    info = tarfile.TarInfo(f"{name}.TRUNCATED-last-{MAX_LOG_BYTES >> 20}-MiB")
    info.size, info.mtime = len(data), int(time.time())
    tar.addfile(info, io.BytesIO(data))


# ---- Set-up phases: dependencies, configure, build, tests, the probe ---------------------------

def pip_dir(module):
    try:
        m = importlib.import_module(module)
        return list(m.__path__)[0]
    except Exception:
        return ""


def find_file(pattern, limit_s=60):
    try:
        done = subprocess.run(["find", "/", "(", "-path", "/proc", "-o", "-path", "/sys", "-o",
                               "-path", "/dev", "-o", "-path", ROOT, ")", "-prune", "-o", "-name",
                               pattern, "-print", "-quit"], capture_output=True, text=True,
                              timeout=limit_s)
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
    except subprocess.TimeoutExpired:
        return ""


def in_toolkit(cuda_root, *patterns):
    dirs = [f"{cuda_root}/{d}" for d in ("include", "lib64", "lib", "targets/x86_64-linux/include",
                                        "targets/x86_64-linux/lib")]
    dirs += ["/usr/include", "/usr/lib/x86_64-linux-gnu"]
    return any(glob.glob(os.path.join(d, p)) for d in dirs for p in patterns)


def add_library_path(check, folder):
    old = check.env.get("LD_LIBRARY_PATH", "")
    check.env["LD_LIBRARY_PATH"] = folder + (":" + old if old else "")


def find_dependency(check, cuda_root, name, var, module, header, library, prefix, missing):
    """A library the configure finds through $VAR, the toolkit or the system; else a pip
    package's folder (include/HEADER, lib/), which sets VAR; else a search of the disk."""
    if check.env.get(var):
        add_library_path(check, check.env[var] + "/lib")
        return f"{name}: {var}={check.env[var]}"
    if in_toolkit(cuda_root, header) and in_toolkit(cuda_root, library):
        return f"{name}: the CUDA toolkit's or the system's"
    d = pip_dir(module)
    if d and os.path.isfile(os.path.join(d, "include", header)):
        check.env[var] = d
        add_library_path(check, d + "/lib")
        return f"{name}: pip package, {var}={d}"
    h, lib = find_file(header), find_file(library)
    if h and lib:
        check.cmake_args += [f"-D{prefix}_INCLUDE_DIR={os.path.dirname(h)}",
                             f"-D{prefix}_LIBRARY={lib}"]
        add_library_path(check, os.path.dirname(lib))
        return f"{name}: found {h} and {lib}"
    return f"{name}: not found (set {var}); {missing}"


def phase_dependencies(check, limit):
    """Unpacks .devdeps/*.deb (scripts/fetch_gpu_deps.sh) into the prefix, checks that every
    library link in it resolves, and finds nvcc, NCCL, cuDNN and its frontend, cuBLAS."""
    lines = []
    debs = sorted(glob.glob(os.path.join(check.deps, "*.deb")))
    ok = True
    if debs:
        os.makedirs(check.prefix, exist_ok=True)
        for deb in debs:
            status, _ = check.run("dependencies", ["dpkg", "-x", deb, check.prefix], limit)
            if status != 0:
                lines.append(f"dpkg -x {os.path.basename(deb)} failed")
                ok = False
        broken = dangling_links(check.prefix)
        if broken:
            lines.append("links that point nowhere (a package did not travel): " + " ".join(broken))
            ok = False
        lib, inc = f"{check.prefix}/usr/lib/x86_64-linux-gnu", f"{check.prefix}/usr/include"
        check.cmake_args += [f"-DCMAKE_PREFIX_PATH={check.prefix}/usr",
                             f"-DCMAKE_LIBRARY_PATH={lib}/openblas-pthread;{lib}",
                             f"-DCMAKE_INCLUDE_PATH={inc}/x86_64-linux-gnu/openblas-pthread;{inc}"]
        add_library_path(check, f"{lib}/openblas-pthread")
        add_library_path(check, lib)
        lines.append(f"{len(debs)} .deb files unpacked into {check.prefix}")
        if check.stub:
            # Here every package is installed too: only the prefix may supply them.
            check.cmake_args += ["-DCMAKE_SYSTEM_IGNORE_PREFIX_PATH=/usr;/",
                                 f"-DCMAKE_CXX_COMPILER={shutil.which('c++')}",
                                 f"-DCMAKE_MAKE_PROGRAM={shutil.which('ninja') or shutil.which('make')}"]
    else:
        lines.append(f"no {check.deps}/*.deb: the system's packages")
    nvcc = shutil.which("nvcc", path=check.env.get("PATH", "")) or (
        "/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else "")
    if nvcc:
        check.env["PATH"] = os.path.dirname(nvcc) + ":" + check.env.get("PATH", "")
        check.cmake_args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        cuda_root = os.path.dirname(os.path.dirname(nvcc))
        lines.append(find_dependency(check, cuda_root, "NCCL", "NCCL_HOME", "nvidia.nccl", "nccl.h",
                                     "libnccl.so*", "NCCL", "the configure will say so"))
        lines.append(find_dependency(check, cuda_root, "cuDNN", "CUDNN_ROOT", "nvidia.cudnn",
                                     "cudnn.h", "libcudnn.so*", "CUDNN",
                                     "no fused attention on cuda"))
        frontend = os.path.join(check.deps, "cudnn_frontend")
        if os.path.isfile(os.path.join(frontend, "include", "cudnn_frontend.h")):
            check.cmake_args.append(f"-DCUDNN_FRONTEND_ROOT={frontend}")
        else:
            lines.append(f"cuDNN frontend: not found: no {frontend} (scripts/fetch_gpu_deps.sh)")
        if not (in_toolkit(cuda_root, "cublas_v2.h") and in_toolkit(cuda_root, "libcublas.so*")):
            h, lib, lt = find_file("cublas_v2.h"), find_file("libcublas.so*"), \
                find_file("libcublasLt.so*")
            if h and lib and lt:
                check.cmake_args += [f"-DCUDA_cublas_LIBRARY={lib}",
                                     f"-DCUDA_cublasLt_LIBRARY={lt}",
                                     f"-DCMAKE_CXX_FLAGS=-isystem {os.path.dirname(h)}",
                                     f"-DCMAKE_CUDA_FLAGS=-isystem {os.path.dirname(h)}"]
                add_library_path(check, os.path.dirname(lib))
                lines.append(f"cuBLAS: not in the toolkit; {lib}")
            else:
                lines.append("cuBLAS: not found; the configure will say so")
    else:
        lines.append("nvcc: not found; no CUDA backend")
        ok = False
    for line in lines:
        check.say(line)
    return ok, "; ".join(l for l in lines if "not found" in l or "nowhere" in l or "failed" in l
                         or "unpacked" in l)


def phase_configure(check, limit):
    """Configures the build: Release, sm_90, tests and benchmarks; no Python module and no MPI
    (no phase needs them, and either could fail a build no phase uses)."""
    build = check.configure_dir
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(cache):
        text = open(cache, errors="replace").read()
        want = "Ninja" if gen else "Unix Makefiles"
        if (f"CMAKE_HOME_DIRECTORY:INTERNAL={ROOT}\n" not in text or
                f"CMAKE_GENERATOR:INTERNAL={want}\n" not in text):
            shutil.rmtree(build)
    cmd = ["cmake", "-S", ROOT, "-B", build, *gen, "-DCMAKE_BUILD_TYPE=Release",
           "-DCMAKE_CUDA_ARCHITECTURES=90", "-DLOCKSTEP_BUILD_TESTS=ON",
           "-DLOCKSTEP_BUILD_BENCH=ON", "-DLOCKSTEP_BUILD_PYTHON=OFF", "-DLOCKSTEP_WITH_MPI=OFF",
           "-DLOCKSTEP_REQUIRE_CUDNN_ATTENTION=ON", *check.cmake_args,
           *shlex.split(os.environ.get("LOCKSTEP_CMAKE_ARGS", ""))]
    status, log = check.run("configure", cmd, limit)
    found = [l.replace("-- lockstep: ", "") for l in log.splitlines()
             if re.match(r"-- lockstep: (CUDA backend|cuDNN)", l)]
    if status != 0:
        missing = missing_dependencies(log)
        return False, ("missing: " + missing) if missing else "see configure.log"
    return True, "; ".join(found)


def phase_build(check, limit):
    status, log = check.run("build", ["cmake", "--build", check.build, "-j",
                                      str(os.cpu_count() or 1)], limit)
    if status != 0:
        errors = [l for l in log.splitlines() if "error" in l.lower()][:3]
        return False, " | ".join(errors)[:600] or "see build.log"
    return True, f"{os.cpu_count()} cores"


def phase_probe(check, limit):
    """Is there a usable GPU, and which cuDNN runs (the one there is not the one checked here)."""
    if check.stub:
        check.gpu = "rehearsal (stubbed)"
        return True, check.gpu
    bench = os.path.join(check.build, "bench", "bench_gpu")
    if not os.access(bench, os.X_OK):
        check.no_gpu = "this build has no CUDA backend (see configure.log)"
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True) \
            if shutil.which("nvidia-smi") else None
        return not (gpus and "GPU" in gpus.stdout), check.no_gpu
    status, log = check.run("probe", [bench, "--probe"], limit)
    gpu = first_line(log, r"^gpu: ", "gpu: ")
    cudnn = first_line(log, r"^cudnn: ", "cudnn: ")
    if cudnn:
        check.notes.append(f"cuDNN         {cudnn}")
    if gpu:
        check.gpu = gpu
        return True, gpu
    check.no_gpu = first_line(log, r"^no usable GPU: ", "no usable GPU: ") or log[-300:]
    return True, "no usable GPU: " + check.no_gpu


def phase_tests(check, limit):
    """The GPU tests (the cuda test suites) in one process, the cuDNN cases last: their plans
    take seconds each to build; then the cuBLAS loader's case in a process of its own (it checks
    that nothing mapped cuBLAS before its first call: Note [cuBLAS loaded on first use]), which
    here finds the machine's cuBLAS as every GPU test's product does. Skips are counted from
    tests/skip.hpp's log."""
    tests = os.path.join(check.build, "tests", "lockstep_tests")
    skip_log = check.log_path("skipped.tsv")
    env = {"LOCKSTEP_SKIP_LOG": skip_log}
    totals = [0, 0, 0]
    failing = []
    ok = True
    deadline = time.monotonic() + limit
    # The cuDNN cases are the test suite "cuda cudnn" (tests/cuda/test_cudnn_attention.cpp).
    for part, filters in (("tests", ["-ts=cuda*", "-tse=cuda cudnn"]),
                          ("tests_cudnn", ["-ts=cuda cudnn"]),
                          ("tests_loader", ["-tc=cuBLAS loads on first use*"])):
        left = int(deadline - time.monotonic())
        if left < 5:
            failing.append(f"({part} not run: the phase's time was spent)")
            ok = False
            break
        status, log = check.run(part, [tests, *filters], left, env=env)
        failing += doctest_failures(log)
        counts = doctest_counts(log)
        if counts:
            totals = [a + b for a, b in zip(totals, counts)]
        if status != 0:
            ok = False
            if not counts and not doctest_failures(log):
                failing.append(f"({part}: exit {status} without a summary; see {part}.log)")
    check.failing_tests = failing
    skips = skip_counts(skip_log)
    skipped = sum(skips.values())
    figure = (f"{totals[1] - skipped} passed, {totals[2]} failed, {skipped} skipped"
              + (f" ({', '.join(f'{k} {v}' for k, v in sorted(skips.items()))})" if skips else "")
              + f" of {totals[0]}")
    return ok and totals[0] > 0, figure


# ---- GPU phases --------------------------------------------------------------------------------
# Each returns (ok, figure). Under --rehearse, each command runs stubbed (Check.stubbed).

def tool(check, *parts):
    return os.path.join(check.build, *parts)


def command_phase(name, cmd_of, figure_of, env_of=None):
    """A phase that runs one command and reads its figure from the log: cmd_of(check) -> list,
    figure_of(log, check) -> str, env_of(check) -> dict."""
    def run(check, limit):
        if check.stub:
            status, log = check.stubbed(name, limit)
            return status == 0, "stubbed"
        status, log = check.run(name, cmd_of(check), limit, env=env_of(check) if env_of else None)
        figure = figure_of(log, check) if status == 0 else ""
        if status == 124:
            return False, f"timed out; {figure or 'see ' + name + '.log'}"
        return status == 0, figure or f"exit {status}, see {name}.log"
    return run


def lines_after(log, prefix):
    return "; ".join(l[len(prefix):].strip() for l in log.splitlines() if l.startswith(prefix))


def attention_figure(log, check):
    # bench_attention's rows at T 1024 (materialised, fused, fused-nondeterministic), then the
    # GPT-2 step with each path.
    rows = [" ".join(l.split()) for l in log.splitlines() if re.match(r"^\s+1024\s", l)]
    return "; ".join(rows + [lines_after(log, "gpu_extra_attention:")])


def breakdown_figure(log, check):
    """bench_gpt --breakdown's JSON lines: each head's step and its parts, milliseconds."""
    rows = []
    for line in log.splitlines():
        if not line.startswith("{") or '"parts"' not in line:
            continue
        d = json.loads(line)
        parts = ", ".join(f"{k} {v:.2f}" for k, v in d["parts"].items())
        rows.append(f"head {d['head']}: step {d['step_ms']:.2f} ms ({parts}; "
                    f"sum {d['parts_sum_ms']:.2f} synchronised)")
    return "; ".join(rows)


def gpt_breakdown_command(check):
    gpt = tool(check, "bench", "bench_gpt")
    common = ["--backend", "cuda", "--preset", "124m", "--batch", "8", "--bf16", "--attention",
              "fused", "--steps", "10", "--warmup", "3", "--breakdown"]
    return ["bash", "-c", " && ".join(
        shlex.join([gpt, *common, "--head", head]) for head in ("chunked", "whole"))]


def gpu_step_figure(log, check):
    return summary_figure(os.path.join(check.logs, "gpu_step.json"))


def summary_figure(path):
    with open(path) as f:
        s = json.load(f)
    syncs, hidden, busy = (s.get("host_syncs_per_step"), s.get("comm_hidden_fraction"),
                           s.get("device_busy"))
    return ("host syncs per step %s, communication hidden %s, device busy %s, %.1f ms per step"
            % ("n/a" if syncs is None else "%g" % syncs,
               "n/a" if hidden is None else "%.0f%%" % (100 * hidden),
               "n/a" if busy is None else "%.0f%%" % (100 * busy),
               1e3 * s["wall_s"] / max(1, s["steps"])))


def shrink_figure(log, check):
    """The recovery's time on the log's clock: from the end of the last step reported before
    the recovery line to the first line after it. The steps are looked up around the recovery
    line, not by number: the step before the lost one, whose totals the lost worker never
    agreed, is reported as the survivors start, after that line (Note [Window across a shrink]
    in src/train/recovery.hpp; before it, it had no line at all)."""
    s = json.load(open(os.path.join(check.logs, "shrink.json")))
    before, after, recovered = None, None, False
    with open(os.path.join(check.logs, "shrink.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if d.get("kind") == "recovery":
                recovered = True
            elif d.get("kind") == "step":
                if not recovered:
                    before = d
                elif after is None:
                    after = d
    if before is None or after is None:
        return "OUT OF BOUNDS: workers_lost %d, no step line %s the recovery" % (
            s["workers_lost"], "before" if before is None else "after")
    gap = after["elapsed_s"] - before["elapsed_s"]
    good = s["workers_lost"] == 1 and gap <= 10
    return ("%sworkers_lost %d, recovery_s %.2f, step %d's end to step %d's %.2f s (goal <= 10)"
            % ("" if good else "OUT OF BOUNDS: ", s["workers_lost"], s["recovery_s"],
               before["step"], after["step"], gap))


def shrink_run(check, limit):
    run = command_phase("shrink", lambda c: [
        tool(c, "lockstep"), "train", "configs/gpt_tiny.yaml", "--set", "trainer.backend=cuda",
        "--set", "trainer.devices=[0,0,0,0]", "--set", "trainer.comm=peer",
        "--set", "trainer.steps=30", "--set", "trainer.eval_every=0", "--set",
        "trainer.log_every=1", "--set", "trainer.checkpoint.dir=null", "--set",
        "trainer.on_worker_failure=shrink", "--set",
        f"trainer.metrics={c.log_path('shrink.jsonl')}",
        "--summary-json", c.log_path("shrink.json")], shrink_figure,
        lambda c: {"LOCKSTEP_FAULT": "2:20:lost"})
    ok, figure = run(check, limit)
    return ok and not figure.startswith("OUT OF BOUNDS"), figure


def exits_1_within(check, name, cmd, env, bound_s=10, limit_s=30):
    """A fault case: `cmd` must exit 1 within `bound_s`. Returns (ok, text)."""
    t0 = time.monotonic()
    status, _ = check.run(name, cmd, min(limit_s, bound_s + 20), env=env)
    took = time.monotonic() - t0
    ok = status == 1 and took <= bound_s
    return ok, f"{name} exit {status} in {took:.1f} s" + ("" if ok else " (FAILED)")


def faults_run(check, limit):
    if check.stub:
        status, _ = check.stubbed("faults", limit)
        return status == 0, "stubbed"
    base = [tool(check, "lockstep"), "train", "configs/quickstart.yaml", "--set",
            "trainer.backend=cuda", "--set", "trainer.devices=[0,0,0,0]", "--set",
            "trainer.comm=peer", "--set", "trainer.steps=1000", "--set",
            f"trainer.checkpoint.dir={os.path.join(check.work, 'faults')}"]
    a = exits_1_within(check, "fault_forward", base, {"LOCKSTEP_FAULT": "2:5:forward"})
    b = exits_1_within(check, "fault_stall", base + ["--set", "trainer.step_timeout_s=2"],
                       {"LOCKSTEP_FAULT": "1:5:stall"})
    return a[0] and b[0], f"{a[1]}; {b[1]}"


def two_process_run(check, limit):
    """Issue 31: two processes make one 2-rank NCCL communicator on GPU 0 over sockets. With
    zero 0 and 1 the parameter hash must equal 2 peer replicas' (two ranks: every sum is one
    exact addition); bf16 must end with identical replicas; a fault on rank 1 must end both with
    exit 1 within 10 s. The two ranks time-slice one GPU while NCCL's kernels spin: 10 steps,
    overlap off."""
    if check.stub:
        status, _ = check.stubbed("two_process", limit)
        return status == 0, "stubbed"
    launcher = tool(check, "tests", "lockstep_two_process_run")
    common = ["configs/gpt_tiny.yaml", "--set", "trainer.backend=cuda", "--set",
              "trainer.steps=10", "--set", "trainer.overlap=false", "--set",
              "trainer.checkpoint.dir=null", "--set", "trainer.log_every=5"]
    nccl = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket",
            "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"}
    deadline = time.monotonic() + limit
    parts, ok = [], True
    for name, extra in (("zero0", ["trainer.zero=0"]), ("zero1", ["trainer.zero=1"]),
                        ("bf16", ["trainer.grad_reduce_dtype=bf16"])):
        sets = [a for kv in extra for a in ("--set", kv)]
        left = int(deadline - time.monotonic()) - 25
        if left < 20:
            parts.append(f"{name}: not run (time)")
            ok = False
            break
        summary = check.log_path(f"two_process_{name}.json")
        status, _ = check.run(f"two_process_{name}", [launcher, *common, *sets, "--set",
                              "trainer.devices=[0]", "--set", "trainer.comm=nccl",
                              "--summary-json", summary], min(left, 120), env=nccl)
        if status != 0:
            parts.append(f"{name}: FAILED (exit {status})")
            ok = False
            continue
        if name == "bf16":
            parts.append(f"{name}: ok (replicas identical)")
            continue
        peer = check.log_path(f"peer_{name}.json")
        check.run(f"peer_{name}", [tool(check, "lockstep"), "train", *common, *sets, "--set",
                                   "trainer.devices=[0,0]", "--set", "trainer.comm=peer",
                                   "--summary-json", peer], min(left, 60))
        h1, h2 = json_field(summary, "param_hash"), json_field(peer, "param_hash")
        same = h1 is not None and h1 == h2
        ok = ok and same
        parts.append(f"{name}: " + ("ok (= 2 peer replicas)" if same
                                    else f"FAILED ({h1} vs peer {h2})"))
    if int(deadline - time.monotonic()) >= 15:
        f_ok, text = exits_1_within(check, "two_process_fault",
                                    [launcher, *common, "--set", "trainer.devices=[0]", "--set",
                                     "trainer.comm=nccl"], dict(nccl, LOCKSTEP_FAULT="1:5:forward"))
        ok = ok and f_ok
        parts.append(text)
    return ok, "; ".join(parts)


def json_field(path, key):
    try:
        with open(path) as f:
            return json.load(f).get(key)
    except (OSError, ValueError):
        return None


def bf16_peak(check):
    gpu = check.gpu
    if "H100 PCIe" in gpu:
        return ["--peak-tflops", "756"]
    if "H100" in gpu or "H200" in gpu:
        return ["--peak-tflops", "989.4"]
    if "A100" in gpu:
        return ["--peak-tflops", "312"]
    return []


def gpt_bf16_figure(log, check):
    rows = [l.strip() for l in log.splitlines()
            if re.match(r"^(lockstep|torch|PyTorch)\S*\s+bf16", l)]
    best = first_line(log, r"^lockstep bf16 / PyTorch at its best")
    return "; ".join(rows + ([best] if best else []))


def steady_steps(log, skip=2):
    """The median tokens/s and MFU (%) of a `lockstep train` log's step lines after the first
    `skip` (the start: the first steps build cuDNN's and cuBLASLt's plans); None without any.
    The summary's tokens/s is the whole run's, start-up included (the model built and
    initialised on the host and copied over), which for a short run of a large model is most of
    its wall time."""
    rates, mfus = [], []
    for m in re.finditer(r"^step (\d+)/\d+ .* ([\d.]+) tokens/s mfu ([\d.]+)%", log, re.M):
        if int(m[1]) > skip:
            rates.append(float(m[2]))
            mfus.append(float(m[3]))
    if not rates:
        return None
    return statistics.median(rates), statistics.median(mfus)


def llama_run(check, limit):
    """Issue 41: Llama 3.2 1B's shape (configs/llama3_2_1b.yaml, from scratch) in bf16 with fused
    attention (cuDNN, grouped-query) on one GPU, 12 steps of 4 x 2048 random tokens: the
    decoder's first run on a GPU. Passes when the run ends with exit 0 (a non-finite loss stops
    it); the figure is its step time, tokens/s and MFU (goal >= 45% of the dense bf16 peak)."""
    if check.stub:
        status, _ = check.stubbed("llama", limit)
        return status == 0, "stubbed"
    tokens = os.path.join(check.work, "llama_tokens.bin")
    count = 13 * 4 * 2048 + 1
    with open(tokens, "wb") as f:  # llm.c's header, then uint16 ids below the vocabulary
        f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
        f.write(os.urandom(2 * count))
    summary = check.log_path("llama.json")
    status, log = check.run("llama", [
        tool(check, "lockstep"), "train", "configs/llama3_2_1b.yaml", "--set",
        f"data.path={tokens}", "--set", "data.eval_path=null", "--set", "data.eval_fraction=0",
        "--set", "trainer.backend=cuda", "--set", "trainer.devices=1", "--set",
        "trainer.steps=12", "--set", "trainer.log_every=1", "--set", "trainer.eval_every=0",
        "--set", "trainer.checkpoint.dir=null", "--set", "schedule.warmup_steps=2",
        "--summary-json", summary], limit)
    if status != 0:
        return False, ("timed out" if status == 124 else f"exit {status}") + ", see llama.log"
    s = json.load(open(summary))
    mfu = s.get("mfu")
    step_ms = 1e3 * s["wall_s"] / max(1, s["steps"])
    steady = steady_steps(log)
    steps = ("n/a" if steady is None else "%.0f tokens/s, MFU %.1f%% (%.0f ms per step)" % (
        steady[0], steady[1], 1e3 * 4 * 2048 / steady[0]))
    return True, ("%s attention, steps 3-12 (medians): %s; whole run with its start: %.0f ms per "
                  "step, %.0f tokens/s, MFU %s; final loss %.3f, host syncs per step %s"
                  % (s.get("attention"), steps, step_ms, s.get("tokens_per_s") or 0,
                     "n/a" if mfu is None else "%.1f%%" % (100 * mfu),
                     s.get("final_train_loss") or float("nan"), s.get("host_syncs_per_step")))


def memory_run(check, limit):
    """Issue 45 on a GPU (bench/device_memory.py): GPT-2 124M at B 8 x T 1024, bf16, fused
    attention, one short run per trainer.recompute mode (then zero 0 and 2 on 2 peer replicas
    while time is left): the memory plan against what the run added to the GPU as its driver
    counts it (goal: within 10%), NVML's peak from outside, and the step time's cost against
    none (goals: selective <= +8%, full <= +35%). Fails when a run fails; a goal not met is a
    figure ("NOT MET"), not a failure. One figure line per run."""
    if check.stub:
        status, _ = check.stubbed("memory", limit)
        return status == 0, "stubbed"
    status, log = check.run("memory", py(check, "device_memory.py", "--deadline-s",
                                         str(max(10, limit - 15)), "--logs", check.logs), limit)
    rows = "\n".join(l[len("device_memory:"):].strip() for l in log.splitlines()
                     if l.startswith("device_memory:"))
    if status == 124:
        return False, "timed out; " + (rows or "see memory.log")
    return status == 0, rows or f"exit {status}, see memory.log"


def py(check, script, *args):
    return [sys.executable, os.path.join(ROOT, "bench", script), "--build", check.build, *args]


def extra(script):
    return lambda c: ["bash", os.path.join(ROOT, "scripts", script)]


def build_env(check):
    return {"LOCKSTEP_GPU_BUILD": check.build, "OUT": check.logs}


PHASES = [
    Phase("dependencies", 10, 90, "unpack .devdeps, find nvcc, NCCL, cuDNN, cuBLAS",
          phase_dependencies, gpu=False),
    Phase("configure", 20, 120, "cmake (Release, sm_90, no Python module, no MPI)", phase_configure,
          gpu=False),
    Phase("build", 150, 300, "cmake --build with every core", phase_build, gpu=False),
    Phase("probe", 5, 30, "bench_gpu --probe: the GPU and the cuDNN that runs", phase_probe,
          gpu=False),
    Phase("tests", 60, 150, "lockstep_tests -ts='cuda*', the cuDNN cases last, then the cuBLAS "
          "loader's alone", phase_tests),
    # Not yet passed on a GPU since they changed (Note [Phase order]): shrink's figure and the
    # metrics it reads (the fourth run); memory's one worker without an NCCL communicator; then
    # the three the fourth run's budget did not reach.
    Phase("shrink", 25, 60, "4 replicas lose one at step 20: recovery within 10 s", shrink_run),
    Phase("memory", 45, 90, "GPT-2 124M bf16 across trainer.recompute: the plan against the "
          "device's memory, step times", memory_run),
    Phase("faults", 25, 45, "a lost and a stalled replica each end the run with exit 1 in 10 s",
          faults_run),
    Phase("two_process", 60, 120, "two processes, one 2-rank NCCL communicator on GPU 0",
          two_process_run),
    Phase("snapshot", 40, 90, "an asynchronous snapshot's cost, GPT-2 124M bf16",
          command_phase("snapshot", lambda c: py(
              c, "snapshot_cost.py", "--device", "cuda", "--preset", "124m", "--batch", "8",
              "--precision", "bf16", "--every", "5", "--snapshots", "6", "--warmup", "5"),
              lambda log, c: lines_after(log, "snapshot_cost:"))),
    # New: where the GPT-2 bf16 step's time goes, for its 0.66x of compiled PyTorch (the fourth
    # run of 2026-12-04).
    Phase("gpt_breakdown", 25, 60, "GPT-2 124M bf16 step in parts (blocks' forward, head and "
          "loss, backward, AdamW), head chunked and whole",
          command_phase("gpt_breakdown", gpt_breakdown_command, breakdown_figure)),
    # Measured on 2026-12-04 (bench/GPU.md).
    Phase("attention", 40, 100, "cuDNN fused attention against the materialised path",
          command_phase("attention", extra("gpu_extra_attention.sh"), attention_figure,
                        build_env)),
    Phase("linear", 60, 120, "cuBLASLt fused epilogues against plain kernels, GPT-2 124M",
          command_phase("linear", extra("gpu_extra_linear.sh"),
                        lambda log, c: lines_after(log, "gpu_extra_linear:"), build_env)),
    Phase("gpu_step", 20, 60, "4 peer replicas of gpt_tiny: host syncs, hidden share, device busy",
          command_phase("gpu_step", lambda c: [
              tool(c, "lockstep"), "train", "configs/gpt_tiny.yaml", "--set",
              "trainer.backend=cuda", "--set", "trainer.devices=[0,0,0,0]", "--set",
              "trainer.comm=peer", "--set", "trainer.overlap=true", "--set", "trainer.steps=40",
              "--set", "trainer.eval_every=0", "--set",
              f"trainer.checkpoint.dir={os.path.join(c.work, 'gpu_step')}",
              "--summary-json", c.log_path("gpu_step.json")], gpu_step_figure)),
    Phase("llama", 60, 120, "Llama 3.2 1B's shape, bf16, fused GQA attention: step time and MFU",
          llama_run),
    Phase("graphs", 50, 120, "GPT-2 124M bf16 with trainer.cuda_graphs off, on and auto",
          command_phase("graphs", lambda c: py(
              c, "graph_step.py", "--device", "cuda", "--preset", "124m", "--batch", "8",
              "--precision", "bf16", "--pairs", "2", "--steps", "12", "--auto"),
              lambda log, c: lines_after(log, "graph_step:"))),
    Phase("gpt_bf16", 90, 150, "GPT-2 124M bf16 against PyTorch at its best (compiled once)",
          command_phase("gpt_bf16", lambda c: py(
              c, "compare_gpt.py", "--device", "cuda", "--preset", "124m", "--batch", "8",
              "--precision", "bf16", *bf16_peak(c), "--pairs", "2", "--steps", "10",
              "--no-fp32", "--torch-best", "--torch-best-rounds", "1",
              "--csv", c.log_path("gpt_bf16.csv")), gpt_bf16_figure)),
    # Measured before, or needed less (bench/GPU.md).
    Phase("mlp_breakdown", 40, 90, "the MLP step op by op against PyTorch's ops",
          command_phase("mlp_breakdown", lambda c: py(c, "mlp_breakdown.py", "--pairs", "3"),
                        lambda log, c: first_line(log, r"^mlp_breakdown: sum", "mlp_breakdown: "))),
    Phase("microbatch", 80, 120, "the fastest micro-batch of GPT-2 124M bf16",
          command_phase("microbatch", lambda c: py(
              c, "sweep_gpt_batch.py", "--device", "cuda", "--preset", "124m", "--precision",
              "bf16", "--batches", "8,16,32,64", "--steps", "6",
              "--csv", c.log_path("microbatch.csv")),
              lambda log, c: first_line(log, r"^fastest:"))),
    Phase("bf16_model", 60, 150, "gpt_tiny fp32 and bf16 on 2 peer replicas, within 2%",
          command_phase("bf16_model", extra("gpu_extra_bf16_model.sh"),
                        lambda log, c: lines_after(log, "gpu_extra_bf16_model:"), build_env)),
    Phase("gpt_parity", 30, 90, "lockstep's fp32 GPT against PyTorch's on the GPU",
          command_phase("gpt_parity", lambda c: [tool(c, "tests", "lockstep_tests"),
                                                 "-tc=gpt parity*", "-s"],
                        lambda log, c: first_line(log, r"worst loss").strip(),
                        lambda c: {"LOCKSTEP_PARITY_BACKEND": "cuda",
                                   "LOCKSTEP_PYTHON": sys.executable})),
    Phase("kernels", 20, 60, "bench_kernels at GPT-2 124M's shapes",
          command_phase("kernels", lambda c: [tool(c, "bench", "bench_kernels"), "--tf32"],
                        lambda log, c: f"{len(log.splitlines())} lines in kernels.log")),
    Phase("gpt_bench", 90, 150, "GPT-2 124M TF32 step against PyTorch eager",
          command_phase("gpt_bench", lambda c: py(
              c, "compare_gpt.py", "--device", "cuda", "--preset", "124m", "--batch", "8",
              "--tf32", "--pairs", "3", "--steps", "10", "--csv", c.log_path("gpt_bench.csv")),
              lambda log, c: first_line(log, r"speedup|lockstep.*ms"))),
    Phase("bench_gpu", 120, 180, "the MLP benchmark, TF32 off/on, N = 1, 2, 4 peer replicas",
          command_phase("bench_gpu", lambda c: [tool(c, "bench", "bench_gpu"), "--csv",
                                                c.log_path("bench_gpu.csv")],
                        lambda log, c: first_line(log, r"^MLP "))),
    Phase("torch", 90, 150, "PyTorch's MLP reference",
          command_phase("torch", lambda c: [sys.executable, os.path.join(ROOT, "bench",
                                                                          "gpu_mlp_torch.py"),
                                            "--csv", c.log_path("torch.csv")],
                        lambda log, c: first_line(log, r"samples/s|TF32"))),
]


def select(names):
    """The phases of PHASES named in `names` (all when empty), set-up phases always first."""
    by_name = {p.name: p for p in PHASES}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"gpu_check: no phase named {', '.join(unknown)} (LOCKSTEP_GPU_PHASES); "
                         f"the phases: {' '.join(by_name)}")
    setup = [p for p in PHASES if not p.gpu or p.name == "tests"]
    chosen = [by_name[n] for n in names if by_name[n] not in setup]
    return setup + (chosen if names else [p for p in PHASES if p not in setup])


def rehearse_report(check):
    """--rehearse: the files that would come back, and whether they may (Note [What comes
    back]). Returns the problems found."""
    problems = []
    files = []
    for folder, _, names in os.walk(check.out):
        depth = os.path.relpath(folder, check.out).count(os.sep) + (folder != check.out)
        for n in names:
            path = os.path.join(folder, n)
            files.append((os.path.relpath(path, check.out), os.path.getsize(path)))
            if depth > 2:
                problems.append(f"{path}: more than two folders down")
    print("files that would come back from $OUT:")
    for name, size in sorted(files):
        print(f"  {name:<24} {size:>10} bytes")
        if size > MAX_FILE_BYTES:
            problems.append(f"{name}: {size} bytes, over {MAX_FILE_BYTES}")
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files in $OUT, over {MAX_FILES}")
    with tarfile.open(os.path.join(check.out, ARCHIVE)) as tar:
        print(f"{ARCHIVE}: {len(tar.getnames())} logs")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rehearse", action="store_true",
                    help="run here with every GPU phase stubbed, against LOCKSTEP_GPU_BUILD")
    ap.add_argument("--plan", action="store_true", help="print the order and budgets, run nothing")
    args = ap.parse_args()
    phases = select(os.environ.get("LOCKSTEP_GPU_PHASES", "").split())
    budget = float(os.environ.get("LOCKSTEP_GPU_BUDGET_S", "540"))
    print(f"gpu_check: {len(phases)} phases in a budget of {budget:.0f} s; if each takes what "
          f"it is expected to, each starts at START with LIMIT s (its cap, cut to what is left):")
    for (name, start, limit), p in zip(plan(phases, budget), phases):
        when = f"at {start:>3.0f} s, {limit:>3} s" if limit else "not reached    "
        print(f"  {name:<14} {when}  (expected {p.expect_s:>3} s, cap {p.cap_s:>3} s)"
              f"{'  GPU' if p.gpu else '     '}  {p.what}")
    if args.plan:
        return 0
    check = Check(args)
    check.phases = phases
    if args.rehearse:
        # The set-up phases run for real where they can here, against an existing build.
        setup_stub = {"build"}
        for p in phases:
            if p.name in setup_stub and not os.path.isdir(check.build):
                raise SystemExit(f"gpu_check --rehearse: no build folder {check.build}; build "
                                 f"first (scripts/test.sh) or set LOCKSTEP_GPU_BUILD")
        phases = [Phase(p.name, p.expect_s, p.cap_s, p.what, rehearse_setup, gpu=False)
                  if p.name in setup_stub else p for p in phases]
        check.phases = phases
    with open(check.log_path("env.log"), "w") as f:
        f.write(environment())
    failed = check.execute()
    check.say(f"finished in {check.elapsed():.0f} s")
    check.save()
    print()
    print(check.table())
    problems = []
    if args.rehearse:
        problems = rehearse_report(check)
        for p in problems:
            print(f"gpu_check --rehearse: {p}")
    return 1 if failed or args.rehearse and problems else 0


def rehearse_setup(check, limit):
    """--rehearse: the build is not made again; the one there is is checked instead."""
    return os.path.exists(os.path.join(check.build, "tests", "lockstep_tests")), \
        f"rehearsal: using {check.build}"


def environment():
    parts = [f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
             f"host: {' '.join(os.uname())}", f"cores: {os.cpu_count()}"]
    for cmd in (["nvidia-smi"], ["nvcc", "--version"], ["cmake", "--version"],
                [sys.executable, "--version"]):
        if shutil.which(cmd[0]):
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                parts.append(done.stdout.strip())
            except subprocess.TimeoutExpired:
                parts.append(f"{cmd[0]}: timed out")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
