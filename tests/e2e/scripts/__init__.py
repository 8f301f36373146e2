"""Programs the e2e tests start as processes (drivers, ``launch`` scripts, workers): not
tests themselves, run by file path or with ``python -m tests.e2e.scripts.<name>``."""
