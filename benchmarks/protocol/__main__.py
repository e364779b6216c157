"""``python -m benchmarks.protocol``: :func:`benchmarks.protocol.driver.main`."""

import sys

from .driver import main

sys.exit(main())
