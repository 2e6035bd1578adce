"""``python -m deploy.local up|down|status``: the lab without the rebound CLI (same code)."""

from workers.cli import main

if __name__ == "__main__":
    import sys

    raise SystemExit(main(["lab", *sys.argv[1:]]))
