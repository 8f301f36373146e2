"""``elastic_train.integrations``: mirrors ``ray.air.integrations`` (``.mlflow``, ``.wandb``).

Each tracker comes two ways, as in Ray: a driver-side callback that logs every
reported row (``RunConfig(callbacks=[...])``), and a ``setup_*()`` function that
opens a tracker run inside the train function (rank 0 only by default).
"""
