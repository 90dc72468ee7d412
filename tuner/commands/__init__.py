"""The `tiledtune` subcommands: each module has `configure(parser)` and `run(args) -> int`."""
