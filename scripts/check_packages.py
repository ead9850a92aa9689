"""Names the Debian packages a traced build read that a fresh machine would not have.

Called by scripts/check_packages.sh, which says why. Usage:
  check_packages.py TRACE_DIR BUILD_DIR PACKAGE...
TRACE_DIR holds strace logs (strace -f -o ...) of a fresh configure, of the tests that use
Python, and of the programs every other test runs; BUILD_DIR is the built folder whose compiles and links count too: their dependency files
(*.o.d, the compiler's -MD output: every header a compile read; *.gch.d for the precompiled
headers, whose headers the compiles that use them do not list) and link lines (link.txt: every
library a link read); PACKAGE... is the install list of scripts/common.sh.

Of the traces, a file counts when a program opened or ran it (CMake its package files and the
programs it runs, Python its modules), or when the build folder's generated compile and link
lines name it: CMake's find_path and find_library only stat what they find. A file that was only
stat-ed and that no compile or link line names was a probe of something unused (FindCUDAToolkit
looks for every CUDA library, OpenCL's among them, wherever it is). Left out as well: shared
libraries the dynamic loader maps into a running tool (opened with O_CLOEXEC), which are that
tool's runtime, and the toolchain's plugins. Of the tests' traces (file names starting with
"tests") count Python (its interpreter, its modules and the wheels venv installs) and every
program a test runs (timeout, setpriv, mpirun, ...); what else they read is the build's.
"""
import os
import re
import subprocess
import sys

# The first quoted argument of a file syscall that succeeded: the path it opened, stat-ed, ran.
CALL = re.compile(r'^\d+\s+(?:<\.\.\. )?(\w+)\((?:AT_FDCWD, )?"([^"]*)"')
FILE_CALLS = {"execve", "open", "openat", "stat", "lstat", "newfstatat", "statx", "access",
              "faccessat", "faccessat2", "readlink", "readlinkat"}

# What a build depends on: headers, libraries, CMake and pkg-config package files, and the
# Python modules the tests import. Programs it ran are kept through execve.
KEPT_SUFFIX = re.compile(r'(\.(h|hh|hpp|hxx|inl|tcc|ipp|cmake|pc|a|so|py|pyc|whl)|\.so\.[0-9.]+)$')
KEPT_UNDER = ("/usr/include/",)
# Not dependencies: the loader's configuration and caches, the toolchain's own plugins, locale
# and time zone data, and setuptools' hook, which Python's site imports at start-up wherever
# python3-setuptools is installed (its distutils-precedence.pth), whoever asked for it.
LEFT_OUT = re.compile(r'^/(etc/ld\.so\.|usr/lib/gcc/[^/]+/[^/]+/plugin/|usr/lib/bfd-plugins/|'
                      r'usr/lib/locale/|usr/share/locale/|usr/share/zoneinfo/|usr/lib/[^/]+/gconv/|'
                      r'usr/lib/python3/dist-packages/_distutils_hack/)')
# Programs that a tool runs, when present, only to learn about the machine, and does without:
# CMake's FindPkgConfig asks pkg-config its version (the install test's consumer configures so;
# nothing of ours uses pkg-config), and pip's vendored distro asks lsb_release for the OS name.
PROBED_PROGRAMS = {"/usr/bin/pkg-config", "/usr/bin/lsb_release"}
SHARED_OBJECT = re.compile(r'\.so(\.[0-9.]+)?$')
PYTHON = re.compile(r'^/usr/(lib/python3|bin/python3|share/python-wheels/)')


def build_lines(build_dir):
    """The text of every generated compile and link line of the build folder."""
    text = []
    for root, _, names in os.walk(build_dir):
        for name in names:
            if name in ("link.txt", "flags.make", "build.ninja"):
                with open(os.path.join(root, name), errors="replace") as f:
                    text.append(f.read())
    return "\n".join(text)


LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib",
                "/lib/x86_64-linux-gnu", "/lib")


def built_files(build_dir):
    """{path: how} of every header the build's compiles read and library its links named."""
    files = {}
    for root, _, names in os.walk(build_dir):
        for name in names:
            if name.endswith((".o.d", ".gch.d")):
                with open(os.path.join(root, name), errors="replace") as f:
                    for word in f.read().replace("\\\n", " ").split():
                        word = word.rstrip(":")
                        if word.startswith("/"):
                            files.setdefault(os.path.normpath(word), "compiled")
            elif name == "link.txt":
                with open(os.path.join(root, name), errors="replace") as f:
                    for word in f.read().split():
                        if word.startswith("/") and SHARED_OBJECT.search(word) or \
                                word.endswith(".a") and word.startswith("/"):
                            files.setdefault(os.path.normpath(word), "linked")
                        elif word.startswith("-l") and len(word) > 2:
                            for d in LIBRARY_DIRS:
                                for ext in (".so", ".a"):
                                    lib = f"{d}/lib{word[2:]}{ext}"
                                    if os.path.exists(lib):
                                        files.setdefault(lib, "linked")
    return files


def traced_files(trace_dir, build_dir):
    """{path: how} of every file under /usr, /lib, /etc (not /usr/local) the build used."""
    lines = build_lines(build_dir)
    files = {}
    for path, how in built_files(build_dir).items():
        if not path.startswith("/usr/local/") and re.match(r'^/(usr|lib|lib64|etc)/', path) \
                and not LEFT_OUT.match(path):
            files.setdefault(path, how)
    for name in sorted(os.listdir(trace_dir)):
        tests = name.startswith("tests")
        with open(os.path.join(trace_dir, name), errors="replace") as log:
            for line in log:
                m = CALL.match(line)
                if not m or m.group(1) not in FILE_CALLS:
                    continue
                path = os.path.normpath(m.group(2))
                if tests and not (PYTHON.match(path) or m.group(1) == "execve"):
                    continue
                if m.group(1) == "execve" and path in PROBED_PROGRAMS:
                    continue
                if not tests and m.group(1) in ("open", "openat") and "O_CLOEXEC" in line and \
                        SHARED_OBJECT.search(path):
                    continue
                if not re.match(r'^/(usr|lib|lib64|etc|bin|sbin)/', path):
                    continue
                if path.startswith("/usr/local/") or LEFT_OUT.match(path):
                    continue
                if not (m.group(1) == "execve" or path.startswith(KEPT_UNDER) or
                        KEPT_SUFFIX.search(path)):
                    continue
                if m.group(1) in ("execve", "open", "openat") or path in lines:
                    files.setdefault(path, m.group(1))
    return {p: c for p, c in files.items() if not os.path.isdir(p)}


def owners():
    """{path: package} from dpkg's file lists."""
    owner = {}
    info = "/var/lib/dpkg/info"
    for name in os.listdir(info):
        if name.endswith(".list"):
            package = name[:-len(".list")].split(":")[0]
            with open(os.path.join(info, name), errors="replace") as lst:
                for line in lst:
                    owner.setdefault(line.rstrip("\n"), package)
    return owner


PYC = re.compile(r'^(.*)/__pycache__/([^/.]+)\.cpython-[0-9]+(\.opt-[0-9])?\.pyc$')


def variants(path):
    """The path, its other spelling under Debian 12's merged /usr, and the same for its target.
    A module's compiled form belongs to no package (Debian compiles it at install): its source's
    package stands for it."""
    out = []
    pyc = PYC.match(path)
    for p in (path, os.path.realpath(path)) + ((f"{pyc[1]}/{pyc[2]}.py",) if pyc else ()):
        out.append(p)
        for short, long in (("/lib", "/usr/lib"), ("/lib64", "/usr/lib64"), ("/bin", "/usr/bin"),
                            ("/sbin", "/usr/sbin")):
            if p.startswith(short + "/"):
                out.append(long + p[len(short):])
            elif p.startswith(long + "/"):
                out.append(short + p[len(long):])
    return out


def closure(packages):
    """The packages plus everything they Depend or Pre-Depend on, recursively."""
    if not packages:
        return set()
    out = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
         "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *packages],
        check=True, capture_output=True, text=True).stdout
    return {line.strip("<>").split(":")[0] for line in out.splitlines()
            if line and not line[0].isspace()}


def base_system():
    """Packages of priority required or important, and essential ones: what Debian installs."""
    out = subprocess.run(["apt-cache", "dumpavail"], check=True, capture_output=True,
                         text=True).stdout
    base = set()
    for record in out.split("\n\n"):
        fields = dict(re.findall(r'^([\w-]+): (.*)$', record, re.M))
        if fields.get("Priority") in ("required", "important") or \
                fields.get("Essential") == "yes":
            base.add(fields["Package"])
    return base


def main():
    trace_dir, build_dir, listed = sys.argv[1], sys.argv[2], sys.argv[3:]
    files = traced_files(trace_dir, build_dir)
    owner = owners()
    fresh = closure(sorted(set(listed) | base_system()))
    by_package = {}
    unowned = 0
    for path in sorted(files):
        package = next((owner[v] for v in variants(path) if v in owner), None)
        if package is None:
            unowned += 1
        else:
            by_package.setdefault(package, path)
    missing = {p: f for p, f in by_package.items() if p not in fresh}
    print(f"check_packages: {len(files)} files read from {len(by_package)} packages "
          f"({unowned} belong to none); a fresh machine with the install list has "
          f"{len(fresh)} packages")
    for package, path in sorted(missing.items()):
        print(f"check_packages: MISSING {package}: the build or the tests used {path} "
              f"({files[path]}), and the install lists of scripts/common.sh do not bring it")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
