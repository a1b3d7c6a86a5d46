"""Entry point: ``python -m backend``."""

import sys

from backend.cli.main import main

sys.exit(main())
