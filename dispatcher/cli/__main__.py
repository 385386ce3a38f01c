"""``python -m dispatcher.cli``: the same as the ``dispatcher`` console script."""

import sys

from dispatcher.cli.main import main

sys.exit(main())
