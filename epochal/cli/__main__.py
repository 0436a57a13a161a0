"""``python -m epochal.cli``."""

import sys

from epochal.cli.main import main

sys.exit(main())
