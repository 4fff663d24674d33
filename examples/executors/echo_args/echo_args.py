"""echo_args: return the arguments unchanged (no capabilities)."""

import sys

import executor_helpers as h


def main(args):
    return {
        "ok": True,
        "entries": [{"echo": args}],
        "ok_count": 1,
        "python": sys.version.split()[0],
    }


if __name__ == "__main__":
    h.run_stdio(main)
