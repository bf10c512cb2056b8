"""`python -m gitdrop` is the gitdrop command."""

from .cli.main import main

main()
