"""``python -m grassflow.cli``: the ``grassflow`` command (e.g. under torchrun)."""

import sys

from . import main

sys.exit(main())
