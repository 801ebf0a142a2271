"""``python -m scheduler.cli``: the ``gpuledger`` console script without the script."""

import sys

from scheduler.cli import main

sys.exit(main())
