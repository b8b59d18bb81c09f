#!/usr/bin/python3
"""docs/ARCHITECTURE.md against the tree: every folder holding tracked files is named there
(as `folder/`, alone or at the end of a path), and so is every source file (C, CUDA, Python,
shell, the wire schema) but the test suites, which follow one pattern (tests/test_*.c); a
header is named with the .c file of its name. A file added, moved or renamed without its line
in the map fails here.

    python3 tests/architecture_map.py SOURCE_DIR

Exits 0 when the map names everything, 1 listing what it misses, 77 outside a git checkout
(the tracked files are git's)."""
import os
import re
import subprocess
import sys

SOURCE = re.compile(r"\.(c|h|cu|cuh|py|sh|proto)$")
SUITE = re.compile(r"^tests/test_[a-z0-9_]+\.c$")


def tracked(src):
    """The tracked files, relative to src; None outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", src, "ls-files"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.split() if out.returncode == 0 else None


def missing(src, files):
    with open(os.path.join(src, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.M | re.S)  # fenced blocks
    words = set()
    for span in re.findall(r"`([^`]+)`", text):
        for w in re.split(r"[\s,()]+", span):
            words.update((w, os.path.basename(w)))
    problems = []
    folders = sorted({os.path.dirname(p) for p in files} - {""})
    for d in folders:
        last = os.path.basename(d) + "/"
        if not any(w.endswith(last) for w in words):
            problems.append("folder %s/ is not named" % d)
    for p in files:
        base = os.path.basename(p)
        twin = base[:-2] + ".c" if base.endswith(".h") else base  # util.h beside util.c
        if SOURCE.search(p) and not SUITE.match(p) and not {base, twin} & words:
            problems.append("file %s is not named" % p)
    return problems


def main(argv):
    if len(argv) != 2:
        print("usage: architecture_map.py SOURCE_DIR", file=sys.stderr)
        return 2
    files = tracked(argv[1])
    if files is None:
        print("SKIP: %s is not a git checkout" % argv[1])
        return 77
    problems = missing(argv[1], files)
    for p in problems:
        print("docs/ARCHITECTURE.md: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
