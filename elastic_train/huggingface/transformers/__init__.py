"""``elastic_train.huggingface.transformers``: mirrors ``ray.train.huggingface.transformers``.

Ray's Transformers guide ports by changing ``ray.train`` to ``elastic_train``::

    import elastic_train.huggingface.transformers

    def train_func(config):
        trainer = transformers.Trainer(model=model, args=args, train_dataset=train_set,
                                       eval_dataset=eval_set)
        trainer.add_callback(elastic_train.huggingface.transformers.RayTrainReportCallback())
        trainer = elastic_train.huggingface.transformers.prepare_trainer(trainer)
        trainer.train()

Needs ``transformers`` and ``accelerate`` (``pip install 'elastic-train[transformers]'``).
"""

from elastic_train.integrations.extras import require

require("transformers", extra="transformers", user="elastic_train.huggingface.transformers")

from elastic_train.huggingface.transformers.prepare import prepare_trainer  # noqa: E402
from elastic_train.huggingface.transformers.report_callback import (  # noqa: E402
    RayTrainReportCallback,
)

__all__ = ["RayTrainReportCallback", "prepare_trainer"]
