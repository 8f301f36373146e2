"""``elastic_train.huggingface``: mirrors ``ray.train.huggingface`` (see ``.transformers``)."""
