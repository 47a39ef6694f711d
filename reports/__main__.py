"""`python -m reports`: see reports.cli."""

import sys

from .cli import main

sys.exit(main())
