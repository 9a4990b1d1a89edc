"""hot.bench.e2e in this process with offload's BACKLOG_BYTES / PREFETCH_BYTES from the
environment (MiB), for a sweep of the two bounds."""
import os
import sys

import hot.nn.offload as off
from hot.bench import e2e

off.BACKLOG_BYTES = int(os.environ.get("OFF_BACKLOG", "256")) << 20
off.PREFETCH_BYTES = int(os.environ.get("OFF_PREFETCH", "160")) << 20
print("offload bounds MiB", off.BACKLOG_BYTES >> 20, off.PREFETCH_BYTES >> 20, flush=True)
sys.exit(e2e.main(sys.argv[1:] + ["--in-process"]))
