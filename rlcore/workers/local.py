"""The hybrid worker in the driver's own process (``trainer.ray = false``).

One worker, world size 1, no Ray: the controller calls the worker's methods directly. The same
``HybridWorker`` runs as under Ray, so a job behaves the same; what changes is that a breakpoint in
a backend or an engine stops the one process a newcomer is debugging, tracebacks are whole, and a
small CPU job skips Ray's start-up. ``tests/trainer`` runs ``Trainer.step`` this way.
"""

from __future__ import annotations

from rlcore.batch import Batch
from rlcore.workers.group import WorkerError, describe_failure, memory_advice, reduce_metrics
from rlcore.workers.hybrid import HybridWorker


class LocalWorkerGroup:
    """``WorkerGroup``'s interface over one ``HybridWorker`` in this process."""

    def __init__(self, name: str, config, plan, roles: tuple[str, ...]):
        self.name, self.roles, self.world_size = name, roles, 1
        self.worker = HybridWorker(config, plan, roles, rank=0, world_size=1, processes_per_node=1)
        self.worker.setup("a group of one rank, in memory")
        self.nodes = ["this process"]

    def call_all(self, method: str, *args) -> list:
        return [self._run(method, *args)]

    def submit_all(self, method: str, *args) -> list:
        """``call_all``, run now (nothing is remote): ``gather`` hands its results back."""
        return self.call_all(method, *args)

    def gather(self, results: list, method: str) -> list:
        return results

    def dispatch(self, method: str, batch: Batch, *args) -> Batch:
        return self._run(method, batch, *args)

    def dispatch_metrics(self, method: str, batch: Batch, data_parallel_ranks=None) -> dict[str, float]:
        return reduce_metrics([self._run(method, batch)])

    def _run(self, method: str, *args):
        """The worker's ``method``; running out of device memory is told as a worker group under Ray tells
        it (``describe_failure``: the keys to lower), other errors pass as they are."""
        try:
            return self.worker.execute(method, *args)[0]
        except Exception as exc:
            if not memory_advice(method, exc):
                raise
            raise WorkerError(describe_failure(self.name, method, 0, "failed", exc,
                                               logs="rlcore --debug shows the full traceback")) from exc

    def take_overhead(self) -> float:
        return 0.0  # no remote calls

    def shutdown(self) -> None:
        """Give the process group back, so that another job can start in this process."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# --- the job's checks of trainer.ray = false (registered by rlcore.builtins) -------------------------


def in_process_problems(job) -> list[str]:
    """``trainer.ray = false`` runs exactly one worker, in the driver's process."""
    config, problems = job.config, []
    trainer = config.trainer
    if trainer.ray:
        return problems
    if trainer.nnodes != 1 or trainer.n_gpus_per_node != 1:
        problems.append(f"trainer.ray = false runs one worker in this process, but trainer.nnodes = "
                        f"{trainer.nnodes} and trainer.n_gpus_per_node = {trainer.n_gpus_per_node} ask for "
                        f"{trainer.nnodes * trainer.n_gpus_per_node}: set both to 1, or trainer.ray = true")
    if config.critic.n_gpus_per_node > 0:
        problems.append("trainer.ray = false runs one worker in this process: a critic pool of its own "
                        f"(critic.n_gpus_per_node = {config.critic.n_gpus_per_node}) needs Ray; set it to 0 "
                        "(the critic shares the worker) or trainer.ray = true")
    if trainer.ray_address:
        problems.append(f"trainer.ray = false runs no Ray, but trainer.ray_address = {trainer.ray_address!r} "
                        "names a cluster: remove one of them")
    return problems
