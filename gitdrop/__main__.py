"""`python -m gitdrop` is the gitdrop command."""

from .cli import main

main()
