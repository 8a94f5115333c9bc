"""``python -m termgym``: the ``termgym`` command."""

import sys

from termgym.cli import main

sys.exit(main())
