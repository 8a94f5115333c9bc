import sys

from termgym.cli import main

sys.exit(main())
