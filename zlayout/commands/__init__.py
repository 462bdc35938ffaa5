"""Subcommands of the command line, one module each (see zlayout/cli.py)."""
