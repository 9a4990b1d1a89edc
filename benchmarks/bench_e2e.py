"""ViT-B/16 training step: HOT (fast backend) vs bf16 autocast, eager and compiled (hot.bench.e2e)."""
import sys

from hot.bench.e2e import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
