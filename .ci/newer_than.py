"""Compares ``pip freeze`` (stdin) with a constraints file.

``python3 .ci/newer_than.py CONSTRAINTS`` prints ``name new old`` for every package
installed at another version than the file pins; ``--update`` rewrites the file's pins
to the installed versions instead (comments and unpinned lines kept).
"""

from __future__ import annotations

import re
import sys

PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+)$")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str]) -> None:
    update = "--update" in argv
    path = [a for a in argv if a != "--update"][0]
    installed = {_key(m[1]): m[2] for line in sys.stdin if (m := PIN.match(line.strip()))}
    lines = open(path).read().splitlines()
    out = []
    for line in lines:
        m = PIN.match(line.strip())
        new = m and installed.get(_key(m[1]))
        if m and new and new != m[2]:
            if update:
                line = f"{m[1]}=={new}"
            else:
                print(m[1], new, m[2])
        out.append(line)
    if update:
        with open(path, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
