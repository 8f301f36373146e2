"""``python -m elastic_train.cli``: the ``elastic-train`` command."""

import sys

from elastic_train.cli.main import main

sys.exit(main())
