"""Rollouts driven by agent programs: each prompt's ``rollout.n`` episodes run the registered agent
concurrently against the endpoint; their recorded calls become the batch's rows.

The rows are the rows every engine returns, with what multi-turn rollouts add: ``response_mask`` (the
loss mask) is 1 only on the tokens the engine generated, ``attention_mask`` is 1 on every real token,
``rollout_log_probs`` are the engine's on generated tokens, 0 elsewhere. A training rollout of an
episode whose calls do not extend each other gives one row per call (``agent/non_extending_episodes``
counts such episodes); ``SOURCE_ROWS`` (batch meta) says which episode each row comes from.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
from pathlib import Path

import attrs
import torch

from rlcore.agents import Agent, Episode
from rlcore.agents.config import agent_section
from rlcore.agents.program import AgentProgram, ProgramFailed
from rlcore.agents.protocol import JobSampling
from rlcore.agents.server import Endpoint
from rlcore.agents.transcript import Row, Transcript
from rlcore.batch import Batch
from rlcore.errors import RlcoreError, check_failed_share
from rlcore.models.loading import resolve_model_path
from rlcore.rewards.scorer import RewardResult
from rlcore.rollout.outputs import eos_token_ids, response_rows
from rlcore.runtime.atomic import publish, staging_file

# Batch meta keys: the agent rollout's metrics, and each row's episode (an index into prompts x n).
AGENT_METRICS = "agent_metrics"
SOURCE_ROWS = "source_rows"
# Batch rows: the text each row's episode is scored on, and the reward its agent returned (NaN: none).
ANSWER, AGENT_REWARD = "response", "agent_reward"


@attrs.frozen
class Outcome:
    # "ok"; "error" (the agent raised, returned something else, or its program wrote a bad result);
    # "timeout"; "exit" (its program exited with a status other than 0)
    status: str
    answer: str | None = None
    reward: float | None = None
    error: str | None = None


class AgentRollout:
    """Runs a rollout's episodes through the endpoint (started at the first rollout): the registered
    ``agent``, or with ``agent = None`` the external program of ``section.command``."""

    def __init__(self, section, agent: Agent | None, tokenizer, config, echo=print):
        rollout = config.rollout
        self.program = AgentProgram(section.argv) if agent is None else None
        if self.program is not None:
            agent = Agent(self.program.run, openai_client=False)
        self.section, self.agent, self.tokenizer, self.echo = section, agent, tokenizer, echo
        self.max_response = config.data.max_response_length
        eos_ids = eos_token_ids(resolve_model_path(config.model.path), tokenizer)
        job = JobSampling(rollout.temperature, rollout.top_p, rollout.top_k, self.max_response)
        self.endpoint = Endpoint(section, tokenizer, eos_ids, job, config.data.max_prompt_length, config.model.path)
        self.started = False
        self._written: dict[str, int] = {}  # record files by label

    def close(self) -> None:
        """Stop the endpoint; no agent process outlives it."""
        if self.program is not None:
            self.program.kill_all()
        self.endpoint.stop()

    @property
    def described(self) -> str:
        return repr(self.section.name) if self.program is None else f"the program {self.program.argv!r}"

    def generate(self, prompts: Batch, sampling, generate, label: str, per_call_rows: bool = True) -> Batch:
        """The rows of ``prompts`` x ``sampling.n`` episodes, unscored; ``label`` names the record file."""
        if not self.started:
            self.endpoint.start()
            self.started = True
            self.echo(f"agents: {self.described} episodes call the endpoint at {self.endpoint.base_url}")
        rows = prompts.repeat_interleave(sampling.n)
        keys = [secrets.token_hex(16) for _ in range(len(rows))]
        prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(rows["input_ids"], rows["attention_mask"])]
        transcripts = {key: Transcript(ids) for key, ids in zip(keys, prompt_ids)}
        episodes = [Episode(prompt=list(rows["raw_prompt"][i]), ground_truth=rows["ground_truth"][i],
                            extra_info=dict(rows["extra_info"][i] or {}), data_source=rows["data_source"][i],
                            base_url=self.endpoint.base_url, api_key=key, sample=i % sampling.n)
                     for i, key in enumerate(keys)]
        self.endpoint.open(transcripts, sampling, generate)
        try:
            outcomes = asyncio.run(self._episodes(episodes))
        finally:  # a stop of the job cancels the episodes, which end their processes; what is left is killed
            if self.program is not None:
                self.program.kill_all()
            engine_calls = self.endpoint.close()
        ordered = [transcripts[key] for key in keys]
        batch = self._rows(ordered, outcomes, per_call_rows)
        metrics = batch.meta[AGENT_METRICS] | {"agent/engine_calls": engine_calls}
        if self.section.record_dir:  # before the failure budget: a stopped job's last episodes are recorded too
            self._write(label, episodes, ordered, outcomes, batch)
        check_failed_share([o.error for o in outcomes if o.error], len(outcomes), self.section.max_failed_share,
                           key="rollout.agent.max_failed_share", subject=f"the agent {self.described}",
                           items="episodes", fix="Fix the agent (agent/errors, agent/timeouts and "
                                                 "agent/exit_failures count each reason)")
        return Batch(batch.tensors, batch.rows, batch.meta | {AGENT_METRICS: metrics})

    # -- episodes -----------------------------------------------------------------------------------
    async def _episodes(self, episodes: list[Episode]) -> list[Outcome]:
        return list(await asyncio.gather(*(self._episode(e) for e in episodes)))

    async def _episode(self, episode: Episode) -> Outcome:
        client = None
        try:
            if self.agent.openai_client:
                client = openai_client(episode)
            result = await asyncio.wait_for(self.agent.run(episode, client), self.section.timeout_s)
            return _outcome(result)
        except TimeoutError:
            return Outcome("timeout", error=f"still running after rollout.agent.timeout_s = {self.section.timeout_s}")
        except ProgramFailed as exc:
            return Outcome(exc.status, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - an agent's failure ends its episode, named and counted
            return Outcome("error", error=f"{type(exc).__name__}: {exc}")
        finally:
            self.endpoint.finish(episode.api_key)
            if client is not None:
                await client.close()

    # -- rows ---------------------------------------------------------------------------------------
    def _rows(self, transcripts: list[Transcript], outcomes: list[Outcome], per_call: bool) -> Batch:
        rows: list[Row] = []
        source: list[int] = []
        for index, transcript in enumerate(transcripts):
            made = transcript.rows(self.max_response, per_call)
            rows += made
            source += [index] * len(made)
        pad = self.tokenizer.pad_token_id
        width = max(len(r.prompt_ids) for r in rows)
        prompt_ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + r.prompt_ids for r in rows])  # (B, P)
        prompt_mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in rows])
        with_log_probs = any(c.log_probs is not None for t in transcripts for c in t.calls)
        out = response_rows(prompt_ids, prompt_mask, [r.response_ids for r in rows],
                            [r.log_probs for r in rows], self.max_response, pad)
        loss_mask = torch.zeros_like(out["response_mask"])  # (B, R)
        for i, row in enumerate(rows):
            loss_mask[i, :len(row.loss_mask)] = torch.tensor(row.loss_mask, dtype=loss_mask.dtype)
        tensors = dict(out.tensors) | {"response_mask": loss_mask}
        if with_log_probs:
            tensors["rollout_log_probs"] = out["rollout_log_probs"] * loss_mask
        else:
            del tensors["rollout_log_probs"]
        answers = [o.answer if o.answer is not None else t.last_text for t, o in zip(transcripts, outcomes)]
        rewards = [_episode_reward(o) for o in outcomes]
        calls = torch.tensor([len(t.calls) for t in transcripts], dtype=torch.float32)
        metrics = {"agent/episodes": len(transcripts), "agent/rows": len(rows),
                   "agent/calls/mean": calls.mean().item(), "agent/calls/min": calls.min().item(),
                   "agent/calls/max": calls.max().item(),
                   "agent/non_extending_episodes": sum(not t.extending() for t in transcripts),
                   "agent/refused_requests": sum(t.refused for t in transcripts),
                   "agent/errors": sum(o.status == "error" for o in outcomes),
                   "agent/timeouts": sum(o.status == "timeout" for o in outcomes),
                   "agent/exit_failures": sum(o.status == "exit" for o in outcomes),
                   "agent/returned_reward": sum(o.reward is not None for o in outcomes)}
        failures = [o.error for o in outcomes if o.error]
        if failures:
            self.echo(f"agents: {len(failures)} of {len(outcomes)} episodes failed (scored 0); the first: {failures[0]}")
        return Batch(tensors, {ANSWER: [answers[i] for i in source], AGENT_REWARD: [rewards[i] for i in source]},
                     {AGENT_METRICS: metrics, SOURCE_ROWS: source})

    def _write(self, label: str, episodes: list[Episode], transcripts: list[Transcript], outcomes: list[Outcome],
               batch: Batch) -> None:
        rows_of: dict[int, list[dict]] = {}
        for i, index in enumerate(batch.meta[SOURCE_ROWS]):
            width = int(batch["prompts"].shape[1])
            prompt = batch["prompts"][i][batch["attention_mask"][i, :width].bool()].tolist()
            real = batch["attention_mask"][i, width:].bool()
            row = {"prompt_ids": prompt, "response_ids": batch["responses"][i][real].tolist(),
                   "loss_mask": batch["response_mask"][i][real].tolist()}
            if "rollout_log_probs" in batch:
                row["log_probs"] = batch["rollout_log_probs"][i][real].tolist()
            rows_of.setdefault(index, []).append(row)
        self._written[label] = self._written.get(label, 0) + 1  # validation runs a rollout per batch
        suffix = "" if self._written[label] == 1 else f"_{self._written[label]}"
        final = Path(self.section.record_dir) / f"{label}{suffix}.jsonl"
        final.parent.mkdir(parents=True, exist_ok=True)
        staged = staging_file(final)
        with staged.open("w", encoding="utf-8") as file:
            for index, (episode, transcript, outcome) in enumerate(zip(episodes, transcripts, outcomes)):
                record = {"episode": index, "sample": episode.sample, "data_source": episode.data_source,
                          "status": outcome.status, "error": outcome.error, "answer": outcome.answer,
                          "reward": outcome.reward} | transcript.to_record() | {"rows": rows_of.get(index, [])}
                file.write(json.dumps(record) + "\n")
        publish(staged, final)


def openai_client(episode: Episode):
    """An ``openai.AsyncOpenAI`` bound to ``episode`` (no retries: a refused call is the agent's to handle)."""
    try:
        import openai
    except ImportError:
        raise RlcoreError("the agent asks for an OpenAI client, but the openai package is not installed: "
                          "pip install 'rlcore[agents]'") from None
    return openai.AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0)


def _outcome(result) -> Outcome:
    if result is None:
        return Outcome("ok")
    if isinstance(result, str):
        return Outcome("ok", answer=result)
    if isinstance(result, (int, float)) and not isinstance(result, bool) and math.isfinite(result):
        return Outcome("ok", reward=float(result))
    return Outcome("error", error=f"the agent returned {result!r}: expected a final answer (str), a finite reward "
                                  "(a number) or None")


def _episode_reward(outcome: Outcome) -> float:
    if outcome.status != "ok":
        return 0.0  # a failed episode scores 0
    return math.nan if outcome.reward is None else outcome.reward


def with_agent_rewards(result: RewardResult, agent_rewards: list[float]) -> RewardResult:
    """The scores with each episode's own: the reward its agent returned, 0 for a failed episode; the
    reward function's score elsewhere (NaN in ``agent_rewards``)."""
    given = torch.tensor(agent_rewards, dtype=torch.float32)  # (B,)
    scores = torch.where(given.isnan(), result.scores.float(), given)
    return RewardResult(scores, result.extra, result.metrics, preds=result.preds)


def agent_rollout(config, tokenizer, manager, echo=print) -> AgentRollout | None:
    """The job's agent rollout (``[rollout.agent]``), or None when no agent drives its episodes."""
    section = agent_section(config)
    if section is None:
        return None
    if section.command is not None:
        return AgentRollout(section, None, tokenizer, config, echo)
    agent = manager.get("agents", section.name)  # an unknown name lists the registered ones
    if not isinstance(agent, Agent):
        raise RlcoreError(f"the agent {section.name!r} is a {type(agent).__name__}, not an rlcore.api.Agent")
    return AgentRollout(section, agent, tokenizer, config, echo)
