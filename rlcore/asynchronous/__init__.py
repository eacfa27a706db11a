"""Asynchronous RL: generation of the next batches overlaps training of this one (docs/async.md).

``config``: the ``[async_training]`` table; ``bridge``: the weight broadcast between the trainer and
the rollout workers; ``inference_copy``: a model of the rollout's own for the ``hf`` engine;
``workers``: the rollout pool's worker and the trainer's; ``trainer``: the controller.
"""
