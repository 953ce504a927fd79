"""Subcommands of the ``inferwatch`` CLI; each module has ``register(subparsers)``."""
