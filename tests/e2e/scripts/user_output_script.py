"""A launched script with its own logging set-up and a tqdm-style progress bar.

    user_output_script.py GO_FILE

It calls ``logging.basicConfig(level=INFO)`` and logs; then redraws one progress
line with ``\\r`` and waits (up to 30 s) for GO_FILE, which the test creates once it
has seen the bar on the launcher's console, before it finishes the bar.
"""

import logging
import os
import sys
import time

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="USERLOG %(levelname)s %(message)s")
    logging.getLogger("user").info("configured by the user")
    sys.stderr.write("\rprogress 1/2")
    sys.stderr.flush()
    deadline = time.monotonic() + 30
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.1)
    seen = "SEEN" if os.path.exists(sys.argv[1]) else "NOT SEEN"
    sys.stderr.write(f"\rprogress 2/2 {seen}\n")
