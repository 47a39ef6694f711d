import sys

from reference.cli import main

sys.exit(main())
