"""``python -m credo.serve``: see :mod:`credo.serve.cli`."""

import sys

from credo.serve.cli import main

sys.exit(main())
