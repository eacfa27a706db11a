"""A run and its folder: the checks before it starts (``preflight``), its lock (``lock``) and record
(``record``), checkpoints (``checkpoint``), generations (``generations``), where its metrics go (``loggers``,
``trackers``) and charts of them (``plot``)."""
