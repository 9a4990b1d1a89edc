"""Per-layer backward benchmark of the fast backend (thin wrapper of hot.bench.backward)."""
import sys

from hot.bench.backward import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
