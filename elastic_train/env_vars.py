"""Every ``ELASTIC_TRAIN_*`` environment variable, named once.

Most are the agent's messages to the workers it starts (set in the worker's
environment, read in the worker); a few are switches a user may set. Modules
import the names from here, so a variable is renamed or documented in one
place. torch.distributed.elastic's own variables (``RANK``, ``WORLD_SIZE``,
``TORCHELASTIC_*``) and torchrun's ``PET_*`` flags are torch's, not listed here.

User switches:

- ``ZYGOTE`` (``ELASTIC_TRAIN_ZYGOTE=0``): start every worker as a fresh
  interpreter instead of forking it from the agent's zygote
  (:mod:`elastic_train.agent.zygote.server`).
- ``FAIL_AT_REPORT``: ``elastic-train verify-resume``'s injected crash, the
  last rank exits after this ``report()`` of the first attempt
  (:mod:`elastic_train.worker.fault_injection`).
- ``LOCAL_TIER`` (``ELASTIC_TRAIN_LOCAL_TIER=0``, in the environment of ``fit()``
  or ``elastic-train launch``): a node does not keep the checkpoint files its
  ranks uploaded to a remote store (for nodes short of disk), so every restart
  downloads what it reads (:mod:`elastic_train.storage.local_tier`).
- ``USER_CODE``: directories (separated by ``:``) whose modules are the user's own
  code, beside the working directory, the driver's script's directory and the
  train function's package: a zygote forked from the driver drops the driver's
  imports of them and never preloads them, so each worker imports them itself, in
  its own environment (:mod:`elastic_train.worker.user_code`).
- ``LEASE_TTL_S``: seconds after its last heartbeat (every quarter of it) a
  driver's lease on its run goes stale and another job may take the run over
  (default 20; :mod:`elastic_train.driver.run_lease`).

Set by the agent or the driver for each worker:

- ``GENERATION``: the worker group's incarnation id, agreed by the agents;
  workers namespace their process-group keys with it.
- ``AGENT_PID``: the agent's pid, so a worker can tell it outlived its agent.
- ``PROGRESS_DIR``: where the worker's heartbeat and stack-dump files go
  (hang detection).
- ``PREEMPTION_DIR`` / ``PREEMPTION_GRACE_S``: where a worker marks that the
  group knew of a preemption notice, and the grace it has after one.
- ``WORKER_PIDS_DIR``: where a zygote's stand-in notes the pid of the worker
  it stands in for, so the agent can stop and wait for that worker itself
  (:mod:`elastic_train.agent.forked_workers`; the stand-in, which imports only
  the standard library, spells the name out).
- ``CHECKPOINT_CACHE``: the node's local tier, its directory of checkpoint files
  kept after upload or downloaded (:mod:`elastic_train.storage.local_tier`).
- ``STORAGE_RETRY_S``: ``RunConfig.storage_retry_timeout_s``, for what reads
  checkpoints in a worker outside its session (the local tier, DCP's reader).
- ``STORAGE_URL``: under ``fit()``, the storage URL as given when it holds a
  password (``https://user:pw@host/...``), which the scratch spec holds redacted.
- ``LAUNCH``: under ``elastic-train launch``, the run's storage, name and
  checkpoint settings as JSON, from which a script's session is built.
- ``LEASE_TOKEN``: the job's lease token on the run; a worker's commits and
  cleanups are refused once a newer job holds the run.
- ``INPROCESS_DIR``: with in-process restarts on, the directory through which
  the worker and its agent agree on attempts (:mod:`elastic_train.worker.restart_channel`).
- ``ATTEMPT``: the attempt a worker starts in (0, or the attempt a replacement
  worker joins); in-process restarts count it up inside the process.
- ``USER_ROOTS``: the directories of the user's own code as the driver decided
  them (:mod:`elastic_train.worker.user_code`), so a worker leaves the same
  modules out of what it reports for the zygote to preload.
- ``MODULES_DIR``: where a worker lists the modules it imported, which the
  agent's zygote then preloads for later workers (:mod:`elastic_train.agent.zygote.preload`).
"""

ZYGOTE = "ELASTIC_TRAIN_ZYGOTE"
FAIL_AT_REPORT = "ELASTIC_TRAIN_FAIL_AT_REPORT"
LOCAL_TIER = "ELASTIC_TRAIN_LOCAL_TIER"
GENERATION = "ELASTIC_TRAIN_GENERATION"
AGENT_PID = "ELASTIC_TRAIN_AGENT_PID"
PROGRESS_DIR = "ELASTIC_TRAIN_PROGRESS_DIR"
PREEMPTION_DIR = "ELASTIC_TRAIN_PREEMPTION_DIR"
PREEMPTION_GRACE_S = "ELASTIC_TRAIN_PREEMPTION_GRACE_S"
WORKER_PIDS_DIR = "ELASTIC_TRAIN_WORKER_PIDS_DIR"
CHECKPOINT_CACHE = "ELASTIC_TRAIN_CHECKPOINT_CACHE"
STORAGE_RETRY_S = "ELASTIC_TRAIN_STORAGE_RETRY_S"
STORAGE_URL = "ELASTIC_TRAIN_STORAGE_URL"
LAUNCH = "ELASTIC_TRAIN_LAUNCH"
LEASE_TTL_S = "ELASTIC_TRAIN_LEASE_TTL_S"
LEASE_TOKEN = "ELASTIC_TRAIN_LEASE_TOKEN"
INPROCESS_DIR = "ELASTIC_TRAIN_INPROCESS_DIR"
ATTEMPT = "ELASTIC_TRAIN_ATTEMPT"
MODULES_DIR = "ELASTIC_TRAIN_MODULES_DIR"
USER_CODE = "ELASTIC_TRAIN_USER_CODE"
USER_ROOTS = "ELASTIC_TRAIN_USER_ROOTS"
