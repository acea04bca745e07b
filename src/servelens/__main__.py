"""``python -m servelens``."""

import sys

from servelens.cli.main import main

sys.exit(main())
