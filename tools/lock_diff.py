"""Print what moved between two locks (`make test-latest`: the committed lock vs today's newest).

python tools/lock_diff.py locks/dev.txt build/latest.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if m := _PIN.match(line):
            found[m.group(1).lower().replace("_", "-")] = m.group(2)
    return found


def moved(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """One line per package added, removed or at another version, by name."""
    return [
        f"{name}: {old.get(name, '(none)')} -> {new.get(name, '(none)')}"
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def main(argv: list[str]) -> int:
    old, new = (pins(Path(p)) for p in argv)
    lines = moved(old, new)
    print(f"{len(lines)} packages moved from {argv[0]} to {argv[1]}:")
    print("\n".join(f"  {line}" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
