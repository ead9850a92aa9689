#!/usr/bin/env python3
"""The Debian packages that must travel to the GPU machine for a build there: the given packages
(scripts/common.sh's install list, as scripts/fetch_gpu_deps.sh passes it) and every package they
depend on, as installed on this machine, less what any machine with a C++ compiler has.

    python3 scripts/gpu_deps.py PACKAGE...     # prints one package a line

The GPU machine's image has a compiler (nvcc needs one), so the C library with its headers, the
C++ runtime and what those depend on, and Debian's essential packages stay behind: unpacked into
the prefix whose libraries go first on LD_LIBRARY_PATH, they would shadow the image's own. A
dependency with alternatives ("a | b") is met by the first alternative installed here, by name or
by what a package provides.
"""

import subprocess
import sys

# What a compiler brings with it (see the docstring).
TOOLCHAIN = ("libc6-dev", "libstdc++6", "libgcc-s1")


def installed():
    """{package: depends} of the installed packages, and {virtual: package}."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f",
         "${Package}\t${db:Status-Abbrev}\t${Pre-Depends}, ${Depends}\t${Provides}\n"],
        capture_output=True, text=True, check=True).stdout
    packages, provides = {}, {}
    for line in out.splitlines():
        name, status, depends, provided = (line.split("\t") + [""] * 4)[:4]
        if not status.startswith("ii"):
            continue
        packages[name] = parse_depends(depends)
        for p in parse_depends(provided):
            provides.setdefault(p[0], name)
    return packages, provides


def parse_depends(field):
    """'a (>= 1) | b, c:any' -> [['a', 'b'], ['c']]: each dependency's alternatives, by name."""
    deps = []
    for dep in field.split(","):
        alternatives = [a.split("(")[0].split(":")[0].strip() for a in dep.split("|")]
        alternatives = [a for a in alternatives if a]
        if alternatives:
            deps.append(alternatives)
    return deps


def closure(roots, packages, provides):
    """The packages `roots` need, themselves included, met by what is installed here."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        name = name if name in packages else provides.get(name, "")
        if not name or name in seen:
            continue
        seen.add(name)
        for alternatives in packages[name]:
            met = next((a for a in alternatives if a in packages or a in provides), None)
            if met:
                todo.append(met)
    return seen


def travelling(roots, packages, provides):
    """The packages to carry for `roots` (see the module's docstring), sorted; raises when a
    root is not installed here."""
    missing = [r for r in roots if r not in packages]
    if missing:
        raise SystemExit(f"gpu_deps: not installed here: {' '.join(missing)} (run "
                         f"scripts/test.sh or apt-get install them first)")
    return sorted(closure(roots, packages, provides) - closure(TOOLCHAIN, packages, provides))


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    packages, provides = installed()
    for name in travelling(argv, packages, provides):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
