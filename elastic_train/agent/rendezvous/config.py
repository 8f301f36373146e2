"""The old home of :class:`~elastic_train.rendezvous_config.RendezvousConfig`, kept as an
alias: every run's ``trainable.pkl`` pickles the config by module path, and runs saved
before it moved must still ``restore``."""

from elastic_train.rendezvous_config import RendezvousConfig as RendezvousConfig  # noqa: F401
