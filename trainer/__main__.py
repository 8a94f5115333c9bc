"""``python -m termgym.trainer ...`` (and ``torchrun ... -m termgym.trainer ...``): ``termgym train ...``."""

import sys

from termgym.cli import main

raise SystemExit(main(["train", *sys.argv[1:]]))
