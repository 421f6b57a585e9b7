"""``python -m dlpack``: the command line, which Ctrl-C ends quietly at any moment."""

from ._interrupt import run

if __name__ == "__main__":
    run()
