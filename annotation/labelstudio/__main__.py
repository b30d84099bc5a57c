"""``python -m annotation.labelstudio start|stop|status|url|password``: the project's own Label Studio server."""

import sys

from annotation.labelstudio.server import main

sys.exit(main())
