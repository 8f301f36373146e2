"""Where the tests find the repository (the working directory of every process they start)."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
