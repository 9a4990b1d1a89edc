import sys

from hot.bench.distributed.cli import main

# Spawned workers import this module again (as __mp_main__): only the launcher runs main().
if __name__ == "__main__":
    sys.exit(main())
