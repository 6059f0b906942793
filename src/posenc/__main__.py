"""``python -m posenc``: the ``posenc`` command (:mod:`posenc.cli`)."""

import sys

from .cli import main

sys.exit(main())
