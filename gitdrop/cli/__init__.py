"""The command line: `gitdrop <command>`, one module per group of commands
(main.py dispatches, base.py holds what every command shares)."""


def main(argv=None):
    """The entry point (also of installs whose `gitdrop` script predates main.py)."""
    from .main import main as run
    return run(argv)
