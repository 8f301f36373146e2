"""``elastic_train.lightning``: mirrors ``ray.train.lightning``.

Ray's Lightning guide ports by changing ``ray.train`` to ``elastic_train``::

    import lightning.pytorch as pl          # or: import pytorch_lightning as pl
    import elastic_train.lightning

    def train_func(config):
        trainer = pl.Trainer(
            max_epochs=10, devices="auto", accelerator="auto",
            strategy=elastic_train.lightning.RayDDPStrategy(),
            plugins=[elastic_train.lightning.RayLightningEnvironment()],
            callbacks=[elastic_train.lightning.RayTrainReportCallback()],
        )
        trainer = elastic_train.lightning.prepare_trainer(trainer)
        trainer.fit(model, train_dataloaders=loader)

Works with either Lightning package, ``lightning.pytorch`` or
``pytorch_lightning`` (see :mod:`elastic_train.lightning.flavour`);
``pip install 'elastic-train[lightning]'`` installs ``pytorch-lightning``.
"""

from elastic_train.lightning.environment import RayLightningEnvironment
from elastic_train.lightning.prepare import prepare_trainer
from elastic_train.lightning.report_callback import RayTrainReportCallback
from elastic_train.lightning.strategies import (
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
)

__all__ = [
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
]
