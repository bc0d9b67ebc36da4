"""``python -m zinfer.broker`` is the ``zinfer`` command."""

import sys

from .cli import main

sys.exit(main())
