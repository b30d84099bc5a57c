"""``python -m pipelines.cli``: the ``stepwise`` command."""

import sys

from pipelines.cli import main

sys.exit(main())
