"""Live recovery, the worker's side: the training state a fault rolls back to, held in
this process's memory (:mod:`.held`) and handed from a survivor to the ranks that lack it
(:mod:`.transfer`). The public face is :class:`elastic_train.torch.LiveState`."""
