"""The ``hot`` command: demo, train, memory, gbops, inspect, bench (see docs/cli.md)."""
