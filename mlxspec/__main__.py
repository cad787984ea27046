"""`python -m mlxspec`: the command line."""

from .frontend.cli import main

main()
