"""A module that, as a script does, prints its usage and calls sys.exit() as it is imported: a
`python` target's factory here must be refused in one line, the process going on."""

import sys

print("usage: exits_on_import [options]")
sys.exit(2)


def targets() -> list[object]:  # never reached
    return []
