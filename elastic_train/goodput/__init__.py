"""Where a run's time went: its goodput ledger read into wall time by cause
(:mod:`.breakdown`, the one reader for ``show``, ``Result.goodput`` and an exporter),
and the checkpoint interval that the measured costs call for (:mod:`.interval`,
``elastic_train.should_checkpoint()``'s rule). Pure computation: it imports no layer
of the package, so the driver, the workers and the CLI all read the same figures."""
