"""The abuse list against `justitia serve` (``justitia.lab.abuse``, where the cases live).

python scripts/abuse.py [--out results/abuse.json]                  # starts its own server (tiny model)
python scripts/abuse.py --url URL --key KEY --other-key KEY2        # a running server started with FLAGS
"""

import sys

from justitia.lab.abuse import main

if __name__ == "__main__":
    sys.exit(main())
