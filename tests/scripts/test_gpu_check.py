"""The GPU check's logic, here where no GPU is (scripts/gpu_check.py, scripts/gpu_deps.py): the
schedule, what comes back, the parsers of what the tools print, and the dependency transport.
The check itself runs only on the lent GPU machine; these cases keep it from failing there for a
reason that shows here."""

import os
import subprocess
import sys
import tarfile
import time
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gpu_check  # noqa: E402
import gpu_deps  # noqa: E402
from gpu_check import Phase  # noqa: E402


def phases(*specs):
    return [Phase(name, expect, cap, name, None) for name, expect, cap in specs]


def test_plan_cuts_the_last_phases_to_the_budget_and_drops_what_cannot_start():
    got = gpu_check.plan(phases(("a", 100, 200), ("b", 50, 100), ("c", 50, 100), ("d", 10, 60)),
                         budget_s=240)
    # a starts at 0 with its cap; b at 100 with its cap; c at 150 with 240 - 150 - reserve;
    # d at 200: 20 s left after the reserve, under the least a phase starts with.
    assert got == [("a", 0, 200), ("b", 100, 100), ("c", 150, 240 - 150 - gpu_check.RESERVE_S),
                   ("d", 200, 0)]


def test_phase_limit():
    assert gpu_check.phase_limit(60, 500) == 60
    assert gpu_check.phase_limit(60, 70) == 70 - gpu_check.RESERVE_S
    assert gpu_check.phase_limit(60, gpu_check.RESERVE_S + gpu_check.MIN_START_S - 1) == 0
    # A phase whose cap is under the least start still starts when its whole cap fits.
    assert gpu_check.phase_limit(10, gpu_check.RESERVE_S + 10) == 10


DOCTEST_LOG = """\
[doctest] doctest version is "2.4.9"
===============================================================================
tests/cuda/test_cuda.cpp:40:
TEST CASE:  cuda: layernorm against the CPU

tests/cuda/test_cuda.cpp:52: ERROR: CHECK( worst <= 1e-5 ) is NOT correct!
  values: CHECK( 0.5 <= 1e-05 )

===============================================================================
tests/cuda/test_cuda.cpp:80:
TEST CASE:  cuda: a case that passes but says why it skipped

tests/cuda/test_cuda.cpp:81: MESSAGE: skipping (gpu): no usable GPU

===============================================================================
tests/cuda/test_cudnn_attention.cpp:106:
TEST CASE:  cuda: cuDNN attention forward and backward

tests/cuda/test_cudnn_attention.cpp:106: FATAL ERROR: test case CRASHED: SIGTERM - Termination request signal

===============================================================================
tests/cuda/test_cuda.cpp:90:
TEST CASE:  cuda: a message that says ERROR in words passes

tests/cuda/test_cuda.cpp:91: MESSAGE: skipping (gpu): cudaErrorNoDevice: ERROR reported by the driver

===============================================================================
tests/cuda/test_cuda_graphs.cpp:53:
TEST CASE:  cuda: graphs capture a step

tests/cuda/test_cuda_graphs.cpp:53: ERROR: test case THREW exception: cudaStreamBeginCapture: ...

===============================================================================
[doctest] test cases: 5 | 2 passed | 3 failed | 400 skipped
[doctest] assertions: 10 | 9 passed | 1 failed |
"""


def test_doctest_failures_names_failed_and_killed_cases_only():
    assert gpu_check.doctest_failures(DOCTEST_LOG) == [
        "cuda: layernorm against the CPU", "cuda: cuDNN attention forward and backward",
        "cuda: graphs capture a step"]
    assert gpu_check.doctest_counts(DOCTEST_LOG) == (5, 2, 3)
    assert gpu_check.doctest_counts("no summary") is None


def test_missing_dependencies_reads_the_configure_line_cmake_wrapped():
    log = ("-- Found Threads: TRUE\nCMake Error at CMakeLists.txt:48 (message):\n"
           "  lockstep: missing build dependencies: fmt (Debian: libfmt-dev), PCRE2 10.40\n"
           "  (Debian: libpcre2-dev)\n\n\n-- Configuring incomplete, errors occurred!\n")
    assert gpu_check.missing_dependencies(log) == \
        "fmt (Debian: libfmt-dev), PCRE2 10.40 (Debian: libpcre2-dev)"
    assert gpu_check.missing_dependencies("-- Configuring done\n") == ""


def test_the_configure_names_every_missing_dependency_in_one_line(tmp_path):
    done = subprocess.run(
        ["cmake", "-S", ROOT, "-B", str(tmp_path / "b"), "-DLOCKSTEP_WITH_CUDA=OFF",
         "-DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON", "-DCMAKE_DISABLE_FIND_PACKAGE_PCRE2=ON",
         "-DCMAKE_DISABLE_FIND_PACKAGE_yaml-cpp=ON"], capture_output=True, text=True)
    assert done.returncode != 0
    assert gpu_check.missing_dependencies(done.stdout + done.stderr) == (
        "fmt (Debian: libfmt-dev), yaml-cpp (Debian: libyaml-cpp-dev), "
        "PCRE2 10.40 (Debian: libpcre2-dev)")


def test_dangling_links_finds_a_dev_link_whose_runtime_did_not_travel(tmp_path):
    lib = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libpcre2-8.so").symlink_to("libpcre2-8.so.0.11.2")  # libpcre2-dev's link
    doc = tmp_path / "usr" / "share" / "doc"
    doc.mkdir(parents=True)
    (doc / "libgomp1").symlink_to("gcc-12-base")                 # documentation: not counted
    assert gpu_check.dangling_links(str(tmp_path)) == ["usr/lib/x86_64-linux-gnu/libpcre2-8.so"]
    (lib / "libpcre2-8.so.0.11.2").write_bytes(b"")              # libpcre2-8-0 came too
    assert gpu_check.dangling_links(str(tmp_path)) == []


PACKAGES = {
    "libpcre2-dev": [["libpcre2-8-0"], ["libpcre2-posix3"]],
    "libpcre2-8-0": [["libc6"]],
    "libpcre2-posix3": [["libpcre2-8-0"]],
    "grep": [["libpcre2-8-0"], ["libc6"]],                # essential, needs PCRE2 too
    "libopenblas-dev": [["libopenblas-pthread-dev", "libopenblas-openmp-dev"]],
    "libopenblas-pthread-dev": [["libopenblas0-pthread"]],
    "libopenblas0-pthread": [["libgfortran5"], ["libc6"]],
    "libgfortran5": [["gcc-12-base"], ["libc6"]],
    "libc6": [["libgcc-s1"]],
    "libgcc-s1": [["gcc-12-base"], ["libc6"]],
    "gcc-12-base": [],
    "libc6-dev": [["libc6"], ["libc-dev-bin"]],
    "libc-dev-bin": [["libc6"]],
    "libstdc++6": [["libgcc-s1"], ["libc6"]],
    "libfmt-dev": [["libfmt9"]],
    "libfmt9": [["libstdc++6"]],
    "ocl-icd-libopencl1": [],
    "libdnnl2": [["libopencl1"]],
}
PROVIDES = {"libopencl1": "ocl-icd-libopencl1"}


def test_gpu_deps_carries_every_library_but_the_compilers_own():
    got = gpu_deps.travelling(["libpcre2-dev", "libopenblas-dev", "libfmt-dev", "libdnnl2"],
                              PACKAGES, PROVIDES)
    # PCRE2's runtime travels though the image surely has it (grep needs it): the -dev's .so
    # link points into it. The first installed alternative, a virtual package through its
    # provider; nothing of the C library or the C++ runtime.
    assert got == ["libdnnl2", "libfmt-dev", "libfmt9", "libgfortran5", "libopenblas-dev",
                   "libopenblas-pthread-dev", "libopenblas0-pthread", "libpcre2-8-0",
                   "libpcre2-dev", "libpcre2-posix3", "ocl-icd-libopencl1"]
    with pytest.raises(SystemExit, match="not installed here: libnope-dev"):
        gpu_deps.travelling(["libnope-dev"], PACKAGES, PROVIDES)
    assert gpu_deps.parse_depends("a (>= 1) | b, c:any") == [["a", "b"], ["c"]]


def test_select_keeps_the_set_up_phases_first_and_refuses_unknown_names():
    names = [p.name for p in gpu_check.select(["two_process", "attention"])]
    assert names == ["dependencies", "configure", "build", "probe", "tests", "two_process",
                     "attention"]
    with pytest.raises(SystemExit, match="no phase named nope"):
        gpu_check.select(["nope"])
    everything = [p.name for p in gpu_check.select([])]
    assert everything == [p.name for p in gpu_check.PHASES]
    assert len(set(everything)) == len(everything)


def make_check(tmp_path, monkeypatch, budget):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setenv("LOCKSTEP_GPU_SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.setenv("LOCKSTEP_GPU_BUDGET_S", str(budget))
    check = gpu_check.Check(types.SimpleNamespace(rehearse=False))
    check.gpu = "a stub GPU"
    return check


def test_the_stubbed_check_brings_back_two_files_with_every_phase_in_the_summary(
        tmp_path, monkeypatch):
    seen = {}

    def fine(check, limit):
        check.run("fine", [sys.executable, "-c", "print('fine: 42 tokens/s')"], limit)
        return True, "42 tokens/s"

    def broken(check, limit):
        # The summary in $OUT already holds the phase before this one.
        with open(os.path.join(check.out, gpu_check.SUMMARY)) as f:
            seen["summary"] = f.read()
        status, _ = check.run("broken", ["false"], limit)
        return status == 0, "exit %d" % status

    def hangs(check, limit):
        status, _ = check.run("hangs", ["sleep", "30"], min(limit, 1))
        return status == 0, "killed" if status == 124 else "?"

    def raises(check, limit):
        raise KeyError("a parser's bug")

    def leaves_a_checkpoint(check, limit):
        os.makedirs(os.path.join(check.work, "ckpt"))
        with open(os.path.join(check.work, "ckpt", "model.bin"), "wb") as f:
            f.write(b"\0" * 1024)
        return True, "ok"

    check = make_check(tmp_path, monkeypatch, budget=gpu_check.RESERVE_S + 100)
    check.phases = [Phase("fine", 1, 10, "", fine), Phase("broken", 1, 10, "", broken),
                    Phase("hangs", 1, 10, "", hangs), Phase("raises", 1, 10, "", raises),
                    Phase("ckpt", 1, 10, "", leaves_a_checkpoint),
                    Phase("too_long", 1, 10_000, "", fine)]
    t0 = time.monotonic()
    # Less than MIN_START_S past the reserve: the 10 s phases start, too_long cannot.
    check.budget = check.elapsed() + gpu_check.RESERVE_S + gpu_check.MIN_START_S - 5
    assert check.execute() is True  # something failed
    assert time.monotonic() - t0 < 20
    assert "fine          ok" in seen["summary"] and "42 tokens/s" in seen["summary"]

    out = os.listdir(check.out)
    assert sorted(out) == [gpu_check.ARCHIVE, gpu_check.SUMMARY]
    summary = open(os.path.join(check.out, gpu_check.SUMMARY)).read()
    assert "broken        FAILED" in summary and "exit 1" in summary
    assert "hangs         TIMED OUT" in summary
    assert "raises        FAILED" in summary and "KeyError" in summary
    assert "too_long      not run: budget spent" in summary
    with tarfile.open(os.path.join(check.out, gpu_check.ARCHIVE)) as tar:
        names = tar.getnames()
    assert "gpu_check/fine.log" in names and "gpu_check/hangs.log" in names
    assert "gpu_check/gpu_check.log" in names and "gpu_check/summary.txt" in names
    assert not any("model.bin" in n for n in names)  # checkpoints stay out of $OUT


def test_gpu_phases_are_skipped_without_a_gpu_with_the_reason(tmp_path, monkeypatch):
    check = make_check(tmp_path, monkeypatch, budget=200)
    check.gpu, check.no_gpu = "", "the build has no CUDA backend"
    ran = []
    check.phases = [Phase("setup", 1, 10, "", lambda c, l: (ran.append(1) or True, "x"),
                          gpu=False),
                    Phase("gpu_phase", 1, 10, "", lambda c, l: (ran.append(2) or True, "x"))]
    assert check.execute() is False
    assert ran == [1]
    assert "gpu_phase     skipped: no usable GPU: the build has no CUDA backend" in check.table()


def test_the_archive_keeps_under_the_size_a_file_may_have_to_come_back(tmp_path, monkeypatch):
    check = make_check(tmp_path, monkeypatch, budget=200)
    check.phases = []
    with open(check.log_path("runaway.log"), "wb") as f:
        f.write(os.urandom(5 << 20))  # does not compress
    check.save()
    with tarfile.open(os.path.join(check.out, gpu_check.ARCHIVE)) as tar:
        member = [m for m in tar.getmembers() if "runaway" in m.name][0]
    assert member.name.endswith(".TRUNCATED-last-4-MiB") and member.size == 4 << 20
    assert os.path.getsize(os.path.join(check.out, gpu_check.ARCHIVE)) < gpu_check.MAX_FILE_BYTES


def test_what_has_not_passed_on_a_gpu_follows_the_tests_and_is_reached():
    names = [p.name for p in gpu_check.PHASES]
    first = ["shrink", "memory", "faults", "two_process", "snapshot"]
    assert names[names.index("tests") + 1:names.index("tests") + 1 + len(first)] == first
    planned = {name: limit for name, _, limit in gpu_check.plan(gpu_check.PHASES, 540)}
    for name in first:  # each with its whole cap, in the default budget
        assert planned[name] == next(p for p in gpu_check.PHASES if p.name == name).cap_s
    assert next(p for p in gpu_check.PHASES if p.name == "memory").expect_s <= 60


def test_the_table_ends_with_the_phases_that_did_not_run(tmp_path, monkeypatch):
    check = make_check(tmp_path, monkeypatch, budget=200)
    check.phases = [Phase(n, 1, 10, "", None) for n in ("a", "b", "c", "d", "e")]
    R = gpu_check.Result
    check.results = {"a": R("ok", "fine\nsecond line"), "b": R("not run", "budget spent"),
                     "c": R("skipped", "no usable GPU"), "d": R("FAILED", "exit 1")}
    table = check.table().splitlines()
    assert table[-1] == "did not run   not run: b; skipped: c; not reached: e"
    # A figure of several lines goes on under its row, indented past the names.
    assert table[table.index("a             ok: fine") + 1] == " " * 14 + "second line"
    check.results["b"] = check.results["c"] = check.results["e"] = R("ok")
    assert check.table().splitlines()[-1] == "did not run   none: every phase ran"


def test_the_memory_phase_figure_has_a_line_per_run_and_fails_with_a_run():
    log = ("| table |\n"
           "device_memory: recompute none: plan 5.20 GiB, measured 5.40 GiB = 1.038x (goal within "
           "10%: met), 61.0 ms/step; NVML -2 MiB against the driver's peak\n"
           "device_memory: recompute full: plan 3.10 GiB, measured 3.30 GiB = 1.065x (goal within "
           "10%: met), 72.0 ms/step (+18.0% vs none, goal <= +35%: met)\n")
    calls = []

    def run(name, cmd, limit):
        calls.append(cmd)
        return (0 if "FAILED" not in log else 1), log

    fake = types.SimpleNamespace(stub=False, build="/b", logs="/l", run=run)
    ok, figure = gpu_check.memory_run(fake, 90)
    assert ok
    assert figure.splitlines() == [
        "recompute none: plan 5.20 GiB, measured 5.40 GiB = 1.038x (goal within 10%: met), "
        "61.0 ms/step; NVML -2 MiB against the driver's peak",
        "recompute full: plan 3.10 GiB, measured 3.30 GiB = 1.065x (goal within 10%: met), "
        "72.0 ms/step (+18.0% vs none, goal <= +35%: met)"]
    cmd = calls[0]
    assert cmd[1].endswith("bench/device_memory.py") and cmd[cmd.index("--build") + 1] == "/b"
    assert int(cmd[cmd.index("--deadline-s") + 1]) < 90  # its runs end before the phase's cap
    log += "device_memory: zero 0, N 2, full: FAILED: exit 1: out of memory\n"
    ok, figure = gpu_check.memory_run(fake, 90)
    assert not ok and figure.endswith("zero 0, N 2, full: FAILED: exit 1: out of memory")


def test_the_llama_figure_is_the_steady_steps_not_the_whole_run_with_its_start():
    # The H200's log of 2026-12-04 (steps 1-4 and 12): the summary's whole-run rate was 14,680
    # tokens/s, MFU 12.2%, most of its wall time the start.
    log = "\n".join([
        "training 1235814400 parameters on 1 worker(s), 12 steps, batch 4 per worker",
        "step 1/12 epoch 0 loss 12.1750 acc 0.0000 lr 1e-05 grad_norm 5.119 23.8 samples/s "
        "48725 tokens/s mfu 40.5%",
        "step 2/12 epoch 0 loss 12.1764 acc 0.0000 lr 2e-05 grad_norm 5.22 23.6 samples/s "
        "48337 tokens/s mfu 40.2%",
        "step 3/12 epoch 0 loss 12.1712 acc 0.0000 lr 2e-05 grad_norm 5.128 23.6 samples/s "
        "48263 tokens/s mfu 40.1%",
        "step 4/12 epoch 0 loss 12.1894 acc 0.0000 lr 1.946e-05 grad_norm 5.167 23.5 samples/s "
        "48106 tokens/s mfu 40.0%",
        "step 12/12 epoch 0 loss 12.1625 acc 0.0000 lr 2e-06 grad_norm 5.223 22.5 samples/s "
        "46148 tokens/s mfu 38.3%",
        "  tokens/s            14680"])
    assert gpu_check.steady_steps(log) == (48106.0, 40.0)
    assert gpu_check.steady_steps(log, skip=0) == (48263.0, 40.1)  # 5 steps: the middle one
    assert gpu_check.steady_steps("no steps") is None


def test_the_breakdown_figure_reads_each_heads_parts():
    line = ('{"framework": "lockstep", "step_ms": 36.8, "head": "%s", "parts": {"forward": 9.5, '
            '"head_loss": 6.25, "backward": 19.0, "adamw": 2.5}, "parts_sum_ms": 37.25}')
    log = "noise\n" + line % "chunked" + "\n" + line % "whole" + "\n"
    figure = gpu_check.breakdown_figure(log, None)
    assert figure.startswith("head chunked: step 36.80 ms (forward 9.50, head_loss 6.25, "
                             "backward 19.00, adamw 2.50; sum 37.25 synchronised); head whole")
    assert gpu_check.breakdown_figure('{"step_ms": 1}\n', None) == ""  # no parts, no figure
