"""The single controller: the driver process that runs the RL dataflow over Ray worker groups.

``Trainer.fit()`` reads as the algorithm: generate, score, old log-probs, reference, values,
advantages, update critic, update actor, sync weights, log, validate, checkpoint.
"""

from __future__ import annotations

import contextlib
import time

import torch

from rlcore.agents.rollout import AGENT_METRICS, AGENT_REWARD, SOURCE_ROWS, agent_rollout, with_agent_rewards
from rlcore.algorithms import AdvantageInputs, apply_kl_penalty, kl_controller, overlong_penalty
from rlcore.algorithms.dynamic_sampling import informative_batch
from rlcore.algorithms.groups import group_ids_of
from rlcore.algorithms.pf_ppo import pf_ppo_sample
from rlcore.algorithms.remax import baseline_prompts
from rlcore.algorithms.rollout_correction import actor_update_batch, correct_batch, rollout_as_old_policy
from rlcore.batch import Batch
from rlcore.config import Job
from rlcore.config.dump import to_toml
from rlcore.data.dataset import PromptDataset, PromptLoader
from rlcore.data.vision import VisionPrompts, has_image_processor, refuse_untrainable_images
from rlcore.errors import RlcoreError
from rlcore.metrics.finite import NonFiniteGuard
from rlcore.metrics.flops import mfu_meter
from rlcore.metrics.progress import summary, validation_keys
from rlcore.metrics.step import Timer, data_metrics, read_metrics, throughput_metrics, timing_metrics, worst_memory
from rlcore.metrics.validation import validation_metrics
from rlcore.models.loading import load_tokenizer, resolve_model_path
from rlcore.plugins.manager import get_manager
from rlcore.profiling.steps import StepProfiler
from rlcore.rewards.placement import last_token_scores, reward_components, reward_rows
from rlcore.rewards.roles import reward_for
from rlcore.rollout.multi_turn import MULTI_TURN_METRICS, TOOL_REWARDS, multi_turn_rollout, with_tool_rewards
from rlcore.rollout.outputs import ROLLOUT_TIMING
from rlcore.runs.checkpoint import CheckpointManager, read_state, resolve_resume
from rlcore.runs.generations import REWARD_EXTRA_KEYS, generation_records, sample_generations, write_generations
from rlcore.runs.lock import RunLock
from rlcore.runs.loggers import JsonlLogger, MultiLogger
from rlcore.runs.preflight import run_directory
from rlcore.runs.record import changed_keys, cut_metrics, environment, previous_record, write_record
from rlcore.runtime.platforms import current_platform
from rlcore.training.backends import image_forwarding_gap, training_backend
from rlcore.training.roles import SamplingParams, group_seed
from rlcore.workers.balancing import balance_metrics, balanced_order
from rlcore.workers.cluster import RayCluster
from rlcore.workers.group import WorkerGroup
from rlcore.workers.local import LocalWorkerGroup
from rlcore.workers.plan import plan_roles


PF_PPO_STREAM = 0x5046_5050  # PF-PPO's draws: a seed stream of their own beside the sampling seeds


class Trainer:
    def __init__(self, job: Job, manager=None, echo=print, mode_choice=None):
        """``mode_choice``: what ``async_training.mode = "auto"`` resolved to for this job
        (``rlcore.asynchronous.auto``), recorded in the run folder; None when the job named its mode."""
        self.job, self.config = job, job.config
        self.mode_choice = mode_choice
        self.manager = manager or get_manager()
        self.echo = echo
        config = self.config
        self.platform = current_platform()
        self.tokenizer = load_tokenizer(resolve_model_path(config.model.tokenizer_path or config.model.path))
        model_folder = resolve_model_path(config.model.path)
        vision = (VisionPrompts(model_folder, self.tokenizer, trust_remote_code=config.model.trust_remote_code)
                  if has_image_processor(model_folder) else None)  # a vision-language model puts images in prompts
        self.train_data = PromptDataset(config.data.train_files, self.tokenizer, config.data, "train", vision)
        self.val_data = (PromptDataset(config.data.val_files, self.tokenizer, config.data, "val", vision)
                         if config.data.val_files else None)
        self.loader = PromptLoader(self.train_data, config.data.train_batch_size, config.data.shuffle,
                                   config.data.seed)
        if len(self.loader) == 0:
            raise RlcoreError(f"data.train_files hold {len(self.train_data)} prompts, fewer than one batch of "
                              f"data.train_batch_size = {config.data.train_batch_size}")
        self.reward = reward_for(config, self.tokenizer, self.manager,
                                 lambda method, batch: self.workers.dispatch(method, batch))
        # data it cannot score (an unknown data_source) now, not after Ray and the workers start
        self.reward.check([*self.train_data.rows, *(self.val_data.rows if self.val_data else [])])
        self.multi_turn = multi_turn_rollout(config, self.tokenizer, self.manager)  # None: single-turn
        self.agents = agent_rollout(config, self.tokenizer, self.manager, echo)  # None: no agent programs
        self.estimator = self.manager.get("advantage_estimators", config.algorithm.adv_estimator)
        self.kl_penalty = self.manager.get("kl_estimators", config.algorithm.kl_penalty)
        self.kl_ctrl = kl_controller(config.algorithm.kl_ctrl)
        trainer = config.trainer
        self.nonfinite = NonFiniteGuard(trainer.max_nonfinite_steps)
        self.mfu = mfu_meter(config, self.platform)
        self.run_dir = run_directory(config)
        self.checkpoints = CheckpointManager(self.run_dir, trainer.max_ckpt_to_keep)
        self.profiler = StepProfiler(config.sections.get("profiler"), self.run_dir, echo)  # [profiler].steps
        self.total_steps = trainer.total_training_steps or len(self.loader) * trainer.total_epochs
        self.plan = plan_roles(config, self.manager, self.total_steps)  # the roles, and each builder's spec
        refuse_untrainable_images((self.train_data, self.val_data), self.image_gaps(vision is not None))
        self.global_step = 0
        self.validations: list[tuple[int, dict]] = []  # (step, metrics) of each validation, for the summary
        self.workers = None  # the hybrid group: actor, rollout, reference, and a colocated critic
        self.critic_workers = None  # the critic's own group when critic.n_gpus_per_node > 0

    # -- the algorithm ---------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Train to ``total_steps``; returns the last step's metrics."""
        self.echo(self.plan.describe())
        started = time.monotonic()
        with RunLock(self.run_dir):  # one job per run folder, taken before Ray starts
            before = previous_record(self.run_dir)  # a resumed run's job, as its last start left it
            self._write_record()  # before Ray, so that a run that fails to start is recorded too
            with RayCluster(self.config) if self.config.trainer.ray else contextlib.nullcontext():
                self.checkpoints.remove_leftovers()
                try:
                    self.start_workers()
                    self.resume()
                    # against the job as started: a colocated job may be arranged again as its workers start
                    if self.global_step and before and (changes := changed_keys(before, to_toml(self.config))):
                        self.echo("warning: the resumed run's configuration changed since its last start "
                                  f"(run.toml): {'; '.join(changes)}")
                    if not self.config.trainer.val_only:
                        cut_metrics(self.run_dir, self.global_step)  # steps about to run again appear once
                    with self._logger() as logger:
                        logger.begin(self.total_steps, self.global_step)
                        metrics = self._loop(logger)
                    self.echo(self._summary(time.monotonic() - started))
                    return metrics
                finally:
                    self.reward.close()  # the reward worker processes
                    self.stop_workers()
                    if self.multi_turn is not None:
                        self.multi_turn.close()
                    if self.agents is not None:
                        self.agents.close()  # the endpoint
                    self.checkpoints.remove_leftovers()  # a save that a stop or crash cut short

    def _write_record(self) -> None:
        """run.toml, overrides.txt and environment.json (``rlcore.runs.record``) of the job as it is now."""
        env = environment(self.platform, self.config.rollout.name, self.config.trainer.backend, self.manager)
        if self.mode_choice is not None:
            env["async_mode"] = self.mode_choice.record()
        write_record(self.run_dir, to_toml(self.config), self.job.source, self.job.overrides, env)

    def _summary(self, wall_seconds: float) -> str:
        checkpoint = self.checkpoints.latest()
        command = training_backend(self.manager, self.config.trainer.backend).export_command
        return summary(self.global_step, self.total_steps, wall_seconds, self.validations, checkpoint,
                       command.format(checkpoint=checkpoint) if command and checkpoint else None)

    # -- the controller's hooks: what another controller (rlcore.asynchronous.trainer) may override or call --
    def image_gaps(self, vision_model: bool) -> list[str]:
        """What this job lacks to train on prompts with images (empty: nothing), each said to the user."""
        from rlcore.rollout.declared import engine_declares, engines_declaring

        config, gaps = self.config, []
        if not vision_model:
            gaps.append(f"model.path {config.model.path!r} is not a vision-language model (its folder has no "
                        "preprocessor_config.json, an image processor's settings)")
        if not engine_declares(self.manager, config.rollout.name, "takes_images"):
            gaps.append(f"rollout.name = {config.rollout.name!r} does not generate with images (engines that do: "
                        f"{', '.join(engines_declaring(self.manager, 'takes_images')) or 'none installed'})")
        if (gap := image_forwarding_gap(self.manager, config.trainer.backend)) is not None:
            gaps.append(gap)
        if max(config.actor.ulysses_sequence_parallel_size, config.ref.ulysses_sequence_parallel_size or 1) > 1:
            gaps.append("ulysses_sequence_parallel_size > 1 splits packed rows over ranks, which rlcore does not do "
                        "with images yet: set it to 1")
        if self.plan.critic:
            gaps.append("the critic (a value model, for adv_estimator = 'gae') does not take images yet")
        rows = [*self.train_data.rows, *(self.val_data.rows if self.val_data else [])]
        if config.trainer.n_gpus_per_node * config.trainer.nnodes > 1 and not all(row["images"] for row in rows):
            gaps.append("rows without images beside rows with them on more than one worker: a worker whose "
                        "micro-batch holds no image would skip the vision tower while the others gather its "
                        "shards; give every row an image or train on one worker")
        if self.multi_turn is not None or self.agents is not None:
            gaps.append("multi-turn and agent rollouts do not carry images yet")
        return gaps

    # start_workers, hybrid_group, worker_groups, stop_workers (workers); sampling_params, dispatch_generate,
    # finish_rollout (generation); generate, sync_weights, checkpoint_state, resume (the step's phases)

    def start_workers(self) -> None:
        """Start the job's worker groups: the hybrid group (actor, engine and the roles beside them)
        and, where the critic has devices of its own, the critic's."""
        trainer, separate = self.config.trainer, self.config.critic.n_gpus_per_node > 0
        roles = ("actor", "rollout") + (("reference",) if self.plan.reference else ()) + (
            ("critic",) if self.plan.critic and not separate else ()) + (
            ("reward_model",) if self.plan.reward_model else ())
        self.workers = self.hybrid_group(roles)
        self.echo(f"workers: {self.workers.world_size} {self.workers.name} ({', '.join(self.workers.roles)}) on "
                  f"{len(set(self.workers.nodes))} node(s)")
        if self.plan.critic and separate:
            self.critic_workers = WorkerGroup("critic", self.config, self.plan, self.platform,
                                              self.config.critic.n_gpus_per_node, trainer.nnodes, ("critic",))
            self.echo(f"workers: {self.critic_workers.world_size} critic on "
                      f"{len(set(self.critic_workers.nodes))} node(s)")

    def hybrid_group(self, roles: tuple[str, ...]):
        """The group of the actor and the roles that share its devices."""
        trainer = self.config.trainer
        if not trainer.ray:  # the one worker in this process
            return LocalWorkerGroup("hybrid", self.config, self.plan, roles)
        return WorkerGroup("hybrid", self.config, self.plan, self.platform, trainer.n_gpus_per_node, trainer.nnodes,
                           roles)

    def worker_groups(self) -> list:
        """Every worker group of the job (each is told to stop, measured and closed)."""
        return [g for g in (self.workers, self.critic_workers) if g is not None]

    def stop_workers(self) -> None:
        """Stop every worker group (at the end of ``fit``, however it ends)."""
        for group in self.worker_groups():
            group.shutdown()

    @property
    def _critic_group(self):
        return self.critic_workers or self.workers

    def _loop(self, logger) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.config.trainer.val_only:
            metrics = self.validate(logger)
            logger.log(metrics, step=self.global_step)
            return metrics
        if self.config.trainer.val_before_train and self.val_data is not None and self.global_step == 0:
            logger.log(self.validate(logger), step=0)
        while self.global_step < self.total_steps:
            self.global_step += 1
            with self.profiler.around(self.global_step, self.worker_groups()):
                metrics = self.step()
            if self._due(self.config.trainer.test_freq) and self.val_data is not None:
                metrics |= self.validate(logger)
            if self._due(self.config.trainer.save_freq):
                metrics |= self.save_checkpoint()
            logger.log(metrics, step=self.global_step)
        return metrics

    def step(self) -> dict[str, float]:
        timer, metrics = Timer(), {}
        for group in self.worker_groups():
            group.take_overhead()  # count only this step's dispatch time, not validation's
        with timer("step"):
            batch, gen_metrics = self.generate(timer)  # timing_s/gen and timing_s/reward
            metrics |= gen_metrics | batch.meta.get(MULTI_TURN_METRICS, {}) | batch.meta.get(AGENT_METRICS, {})
            if self.estimator.needs_baseline_rollout:
                with timer("gen_max"):
                    batch = batch.update(Batch(rows={"reward_baseline": self._baseline_scores(batch).tolist()}))
            if self.config.trainer.balance_batch:
                batch, balance = self.balance(batch)
                metrics |= balance
            if self.plan.old_log_prob_pass:  # else the update's own forward pass gives them, or the rollout
                with timer("old_log_prob"):
                    batch = batch.update(self.workers.dispatch("compute_log_prob", batch))
            batch = rollout_as_old_policy(batch, self.config.algorithm)
            batch, mismatch_metrics = self.correct_for_rollout(batch)
            metrics |= mismatch_metrics
            if self.plan.reference:
                with timer("ref"):
                    batch = batch.update(self.workers.dispatch("compute_ref_log_prob", batch))
            if self.plan.critic:
                with timer("values"):
                    batch = batch.update(self._critic_group.dispatch("compute_values", batch))
            with timer("adv"):
                batch, adv_metrics = self.compute_advantages(batch)
            metrics |= adv_metrics
            if self.plan.critic:
                with timer("update_critic"):
                    metrics |= self._critic_group.dispatch_metrics("update_critic", batch,
                                                                   self._data_parallel_ranks("critic"))
            if self.global_step > self.config.trainer.critic_warmup:
                with timer("update_actor"):
                    metrics |= self.workers.dispatch_metrics("update_actor", actor_update_batch(batch),
                                                             self._data_parallel_ranks("actor"))
                with timer("update_weights"):
                    metrics |= self.sync_weights()
            if self.config.trainer.rollout_data_dir:
                with timer("dump_rollout_generations"):
                    write_generations(self.config.trainer.rollout_data_dir, self.global_step,
                                      generation_records(batch, self.tokenizer, self.global_step))
        metrics |= data_metrics(batch, self.config.data.max_response_length, self.config.data.max_prompt_length)
        metrics |= throughput_metrics(batch, timer.seconds["step"], self.workers.world_size)
        metrics |= self.mfu.metrics(batch["attention_mask"].sum(-1).tolist(), timer.seconds, self.workers.world_size)
        metrics |= timer.metrics() | timing_metrics(batch, timer.seconds)
        metrics |= worst_memory([m for g in self.worker_groups() for m in g.call_all("memory")])
        metrics["timing_s/dispatch"] = sum(g.take_overhead() for g in self.worker_groups())
        metrics |= {"training/global_step": self.global_step, "training/epoch": self.training_epoch()}
        metrics |= self.nonfinite.check(self.global_step, metrics)  # stops a run whose updates keep failing
        return metrics

    # -- steps -----------------------------------------------------------------------------------
    def training_epoch(self) -> int:
        """The epoch of the batch this step trains (``training/epoch``)."""
        return self.loader.epoch

    def sync_weights(self) -> dict[str, float]:
        """The actor's new weights into the rollout engine; metrics of the sync (none here)."""
        self.workers.call_all("sync_weights")
        return {}

    def sampling_params(self, validation: bool = False, attempt: int = 0, step: int | None = None) -> SamplingParams:
        """This call's sampling settings. Its seed follows trainer.seed, the step and (with dynamic
        sampling) the attempt, so a step's samples do not depend on the layout of ranks or on a resume;
        validation always draws with the same seed."""
        r = self.config.rollout
        s = r.val if validation else r
        step = self.global_step if step is None else step
        seed = self.config.trainer.seed if validation else group_seed(self.config.trainer.seed, step * 1_000 + attempt)
        return SamplingParams(n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                              do_sample=s.do_sample, max_new_tokens=self.config.data.max_response_length, seed=seed)

    def _rollout(self, prompts: Batch, sampling: SamplingParams, timer: Timer | None = None,
                 purpose: str = "train") -> Batch:
        """Generate and score: the batch gains responses, ``token_level_scores`` and reward extras.
        ``purpose``: "train", "val" or "baseline" (ReMax's greedy baseline)."""
        timer = timer or Timer()
        with timer("gen"):
            if self.multi_turn is not None:  # turn after turn over the same engine, tools in between
                batch = self.multi_turn.generate(prompts, sampling, self.dispatch_generate)
            elif self.agents is not None:  # agent programs through the endpoint; scored once per episode
                label = str(self.global_step) if purpose == "train" else f"{purpose}_{self.global_step}"
                batch = self.agents.generate(prompts, sampling, self.dispatch_generate, label,
                                             per_call_rows=purpose == "train")
            else:
                batch = self.dispatch_generate(prompts, sampling)
        return self.finish_rollout(prompts, batch, sampling, timer)

    def dispatch_generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """The engines' responses to ``prompts`` (n rows each), unscored."""
        return self.workers.dispatch("generate", prompts, sampling)

    def finish_rollout(self, prompts: Batch, batch: Batch, sampling: SamplingParams, timer: Timer) -> Batch:
        """The generated ``batch`` with its prompts' rows, the engine's timings and the rewards."""
        with timer("gen"):
            if not self.config.rollout.calculate_log_probs:
                batch = Batch({k: v for k, v in batch.tensors.items() if k != "rollout_log_probs"}, batch.rows,
                              batch.meta)
        for phase, seconds in batch.meta.get(ROLLOUT_TIMING, {}).items():  # rank 0's share of timing_s/gen
            timer.seconds[f"gen/{phase}"] = timer.seconds.get(f"gen/{phase}", 0.0) + seconds
        rows = prompts.repeat_interleave(sampling.n)
        if SOURCE_ROWS in batch.meta:  # rows of their own (agent episodes): each row's prompt row
            rows = rows.select(batch.meta[SOURCE_ROWS])
        batch = Batch(batch.tensors, rows.rows | batch.rows, batch.meta)
        with timer("reward"):
            return self.score(batch)

    def generate(self, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """One training batch of responses, scored; with dynamic sampling, only informative groups."""
        sampling = self.sampling_params()
        filtering = self.config.algorithm.filter_groups
        if not filtering.enable:
            return self._rollout(self.loader.next_batch(), sampling, timer), {}
        return informative_batch(
            lambda attempt: self._rollout(self.loader.next_batch(), self.sampling_params(attempt=attempt), timer),
            self.config.data.train_batch_size, sampling.n, filtering, self.tokenizer.pad_token_id)

    def score(self, batch: Batch) -> Batch:
        """Reward: score each response, place it on its last token, apply overlong shaping."""
        result = self.reward.score(batch)
        if self.multi_turn is not None:  # the tools' reward signals (rollout.multi_turn.tool_rewards)
            result = with_tool_rewards(result, batch[TOOL_REWARDS], self.multi_turn.config.tool_rewards)
        if self.agents is not None:  # the rewards agents returned, 0 for failed episodes
            result = with_agent_rewards(result, batch[AGENT_REWARD])
        scores = result.scores.float()  # (B,)
        overlong = self.config.reward.overlong_buffer
        if overlong.enable:
            scores = scores + overlong_penalty(batch["response_mask"].sum(-1), self.config.data.max_response_length,
                                               overlong.len, overlong.penalty_factor)
        return batch.update(Batch({"token_level_scores": last_token_scores(scores, batch["response_mask"])},
                                  reward_rows(result),
                                  {"reward_metrics": result.metrics, REWARD_EXTRA_KEYS: tuple(result.extra)}))

    def correct_for_rollout(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Rollout importance sampling (``algorithm.rollout_is_*``, rlcore.algorithms.rollout_correction)."""
        missing = ("rollout.calculate_log_probs is false" if not self.config.rollout.calculate_log_probs
                   else f"rollout engine {self.config.rollout.name!r} did not return them (rollout_log_probs)")
        batch, metrics = correct_batch(batch, self.config.algorithm, missing,
                                       in_update=self.plan.actor_algorithms.rollout_correction is not None)
        return batch, read_metrics(metrics)

    def compute_advantages(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        metrics = dict(batch.meta.get("reward_metrics", {}))
        rewards = batch["token_level_scores"]
        if self.config.algorithm.use_kl_in_reward:
            rewards, kl_metrics = apply_kl_penalty(rewards, batch["old_log_probs"], batch["ref_log_prob"],
                                                   batch["response_mask"], self.kl_ctrl, self.kl_penalty)
            metrics |= kl_metrics
        baseline = (torch.tensor(batch["reward_baseline"], dtype=torch.float32)
                    if self.estimator.needs_baseline_rollout else None)
        out = self.estimator.compute(AdvantageInputs(
            token_level_rewards=rewards, response_mask=batch["response_mask"], group_ids=group_ids_of(batch["uid"]),
            values=batch["values"] if "values" in batch else None, baseline_scores=baseline,
            reward_components=(reward_components(batch, self.config.algorithm.gdpo_reward_keys)
                               if self.estimator.needs_reward_components else None),
            **{key: batch[key] for key in ("old_log_probs", "sum_pi_squared", "rollout_is_weights") if key in batch},
        ), self.config.algorithm)
        batch = batch.update(Batch({"token_level_rewards": rewards, "advantages": out.advantages,
                                    "returns": out.returns}))
        if self.config.algorithm.use_pf_ppo and self.estimator.needs_critic:
            batch, pf_metrics = self.pf_ppo_resample(batch)
            metrics |= pf_metrics
        return batch, metrics

    def pf_ppo_resample(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """PF-PPO (``algorithm.use_pf_ppo``): the batch drawn again with replacement, weighted by each
        sample's score; the draw follows trainer.seed and the step, so a resumed run draws the same rows."""
        pf = self.config.algorithm.pf_ppo
        generator = torch.Generator().manual_seed(group_seed(self.config.trainer.seed ^ PF_PPO_STREAM, self.global_step))
        rows = pf_ppo_sample(batch["token_level_scores"].sum(-1), pf.reweight_method, pf.weight_pow, generator)
        return batch.select(rows.tolist()), {"pf_ppo/distinct_samples": float(len(set(rows.tolist())) / len(rows))}

    def _data_parallel_ranks(self, role: str) -> list[int]:
        """The backend's data-parallel group of each rank of ``role``'s workers: an update's batch is
        split evenly over the groups (``TrainingBackend.data_parallel_ranks``)."""
        group = self._critic_group if role == "critic" else self.workers
        backend = training_backend(self.manager, self.config.trainer.backend)
        return backend.data_parallel_ranks(getattr(self.plan.specs, role), group.world_size)

    def balance(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """``trainer.balance_batch``: the rows reordered so that each worker's share holds about as
        many tokens as the others'; verl's ``global_seqlen/*`` metrics."""
        workers = self.workers.world_size
        if workers == 1 or len(batch) % workers:
            return batch, {}
        lengths = batch["attention_mask"].sum(-1).tolist()
        order = balanced_order(lengths, workers)
        return batch.select(order), balance_metrics(lengths, order, workers)

    def _baseline_scores(self, batch: Batch) -> torch.Tensor:
        """ReMax: the score of one greedy response per prompt, repeated for its n samples (B,); the
        batch as generated, each prompt's samples in a row."""
        n = self.config.rollout.n
        greedy = SamplingParams(n=1, do_sample=False, temperature=0.0,
                                max_new_tokens=self.config.data.max_response_length)
        scored = self._rollout(baseline_prompts(batch, n), greedy, purpose="baseline")
        return torch.as_tensor(scored["score"], dtype=torch.float32).repeat_interleave(n)

    def validate(self, logger=None) -> dict[str, float]:
        """Generate for every validation prompt with ``rollout.val`` sampling and score it: the
        ``val-core/`` metrics; the generations go to ``trainer.validation_data_dir`` and, a sample of
        ``trainer.log_val_generations`` of them, to the loggers."""
        timer, trainer = Timer(), self.config.trainer
        with timer("testing"):
            sampling = self.sampling_params(validation=True)
            scored = [self._rollout(prompts, sampling, purpose="val") for prompts in self.val_data.batches(
                self.config.data.val_batch_size or len(self.val_data))]
            batch = Batch.concat(Batch(rows=b.rows) for b in scored)  # prompt widths differ by batch
            if trainer.validation_data_dir or trainer.log_val_generations:
                records = [r for b in scored for r in generation_records(b, self.tokenizer, self.global_step)]
                if trainer.validation_data_dir:
                    write_generations(trainer.validation_data_dir, self.global_step, records)
                if trainer.log_val_generations and logger is not None:
                    logger.log_generations(sample_generations(records, trainer.log_val_generations),
                                           self.global_step)
        extras = tuple(scored[0].meta.get(REWARD_EXTRA_KEYS, ())) if scored else ()
        metrics = validation_metrics(batch, extras, sampling.n, seed=self.config.trainer.seed)
        self.validations.append((self.global_step, {k: metrics[k] for k in validation_keys(metrics)}))
        return metrics | timer.metrics()

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self) -> dict[str, float]:
        timer = Timer()
        with timer("save_checkpoint"):
            staging = self.checkpoints.begin(self.global_step)
            try:
                for group in self.worker_groups():
                    group.call_all("save", str(staging))
                self.checkpoints.commit(staging, self.global_step, self.checkpoint_state())
            except BaseException:
                self.checkpoints.abort(staging)
                raise
        return timer.metrics()

    def checkpoint_state(self) -> dict:
        """The controller's part of a checkpoint: where the data stands, the adaptive KL coefficient."""
        return {"loader": self.loader.state_dict(), "kl_coef": self.kl_ctrl.value}

    def resume(self) -> dict | None:
        """Load the checkpoint that ``trainer.resume_mode`` names, if any; returns its controller state."""
        trainer = self.config.trainer
        checkpoint = resolve_resume(self.run_dir, trainer.resume_mode, trainer.resume_from_path)
        if checkpoint is None:
            return None
        state = read_state(checkpoint)
        for group in self.worker_groups():
            group.call_all("load", str(checkpoint))
        self.loader.load_state_dict(state["loader"])
        self.kl_ctrl.value = state["kl_coef"]
        self.global_step = state["global_step"]
        self.echo(f"resumed from {checkpoint} at step {self.global_step}")
        return state

    # -- helpers ---------------------------------------------------------------------------------
    def _due(self, frequency: int) -> bool:
        return frequency > 0 and (self.global_step % frequency == 0 or self.global_step == self.total_steps)

    def _logger(self):
        loggers = [JsonlLogger(self.config, self.run_dir)]
        for name in self.config.trainer.logger:
            loggers.append(self.manager.get("loggers", name)(self.config, self.run_dir))
        return contextlib.closing(MultiLogger(loggers))

