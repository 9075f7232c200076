"""``python -m vta_ext``: the ``vta-ext`` command line (:mod:`vta_ext.cli`)."""
import sys

from .cli import main

sys.exit(main())
