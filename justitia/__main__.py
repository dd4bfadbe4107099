"""``python -m justitia`` runs the command line."""

import sys

from justitia.cli import main

sys.exit(main())
