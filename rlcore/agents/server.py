"""The OpenAI-compatible endpoint: ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` on
``rollout.agent.host``:``port``, served by uvicorn (FastAPI) in a thread of the driver, in front of the
job's rollout engine.

Every request names its episode by its API key (``Authorization: Bearer <key>``); a key that names no
running episode is refused. Calls of all episodes are gathered into one engine call (``generate``, the
controller's dispatch to the engine of any registered kind): the first waiting call waits until every
running episode has a call waiting, or ``batch_wait_s``, then all waiting calls go to the engine together
while new ones queue for the next.
"""

# no ``from __future__ import annotations``: FastAPI reads the handlers' annotations (``Request``) at run time
import asyncio
import socket
import threading
from collections.abc import Callable
from pathlib import PurePath

import attrs
import torch

from rlcore.agents.protocol import (
    JobSampling,
    RequestError,
    assistant_message,
    chat_body,
    check_request,
    completion_body,
    token_logprobs,
)
from rlcore.agents.transcript import Call, ChatRenderer, Transcript
from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.training.roles import SamplingParams, group_seed


@attrs.define
class _Pending:
    prompt_ids: list[int]
    max_tokens: int
    future: asyncio.Future


@attrs.define
class Phase:
    """One rollout's episodes (by key), its sampling and the engine function."""

    episodes: dict[str, Transcript]
    sampling: SamplingParams
    generate: Callable[[Batch, SamplingParams], Batch]
    running: int
    engine_calls: int = 0
    pending: list[_Pending] = attrs.Factory(list)


class Endpoint:
    """The server and its scheduler; ``open`` a rollout's episodes, ``finish`` each, ``close`` it."""

    def __init__(self, section, tokenizer, eos_ids: list[int], job: JobSampling, max_prompt: int, model: str):
        """``section``: the job's ``[rollout.agent]``; ``job``: its sampling; ``max_prompt``: data.max_prompt_length."""
        self.section, self.tokenizer, self.job = section, tokenizer, job
        self.eos_ids = set(eos_ids)
        self.max_context = max_prompt + job.max_tokens  # the longest prompt a call may send
        self.model = PurePath(model).name or model
        self.renderer = ChatRenderer(tokenizer, eos_ids)
        self.phase: "Phase | None" = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server = None
        self._wake: asyncio.Event | None = None
        self.port = 0

    # -- life ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind the port and serve in a daemon thread until ``stop``."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.section.host, self.section.port))
        except OSError as exc:
            sock.close()
            raise RlcoreError(f"rollout.agent: the endpoint cannot listen on {self.section.host}:{self.section.port} "
                              f"({exc}); set rollout.agent.port = 0 for a free port") from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        async def serve():
            self._wake = asyncio.Event()
            scheduler = asyncio.create_task(self._schedule())
            started.set()
            try:
                await self._server.serve(sockets=[sock])
            finally:
                scheduler.cancel()

        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(serve(),),
                                        name="rlcore-agent-endpoint", daemon=True)
        self._thread.start()
        started.wait(timeout=30)

    @property
    def base_url(self) -> str:
        return f"http://{self.section.host}:{self.port}/v1"

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    # -- a rollout's episodes (called from the driver's thread) ----------------------------------------
    def open(self, episodes: dict[str, Transcript], sampling: SamplingParams,
             generate: Callable[[Batch, SamplingParams], Batch]) -> None:
        self.phase = Phase(episodes, sampling, generate, running=len(episodes))

    def finish(self, key: str) -> None:
        """An episode's agent has returned: calls no longer wait for it to join a batch."""
        def done():
            if self.phase is not None and key in self.phase.episodes:
                self.phase.running -= 1
                self._wake.set()
        self.loop.call_soon_threadsafe(done)

    def close(self) -> int:
        """End the rollout: its keys are refused from now on. Returns the engine calls it took."""
        phase, self.phase = self.phase, None
        return phase.engine_calls if phase else 0

    # -- HTTP ---------------------------------------------------------------------------------------
    def app(self):
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse

        app = FastAPI(title="rlcore agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)

        async def answer(request: Request, kind: str):
            transcript = None
            try:
                transcript = self._episode(request)
                try:
                    body = await request.json()
                except ValueError:
                    raise RequestError("the request body is not JSON") from None
                return JSONResponse(await self._call(transcript, check_request(body, kind, self.job)))
            except RequestError as error:
                if transcript is not None:
                    transcript.refused += 1
                return JSONResponse(error.body(), status_code=error.status)

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await answer(request, "chat")

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await answer(request, "completion")

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                                "owned_by": "rlcore"}]}

        return app

    def _episode(self, request) -> Transcript:
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else ""
        phase = self.phase
        if phase is None or key not in phase.episodes:
            raise RequestError("the API key names no running episode: each episode gets its own key, valid "
                               "while its rollout runs", code="invalid_api_key", status=401)
        return phase.episodes[key]

    async def _call(self, transcript: Transcript, request) -> dict:
        if len(transcript.calls) + transcript.in_flight >= self.section.max_calls:
            raise RequestError(f"the episode has made rollout.agent.max_calls = {self.section.max_calls} calls; "
                               "answer now", code="episode_call_limit")
        if request.kind == "chat":
            prompt_ids = transcript.chat_prompt(request, self.renderer)
        else:
            prompt_ids = transcript.completion_prompt(request, self.tokenizer)
        field = "messages" if request.kind == "chat" else "prompt"
        if len(prompt_ids) > self.max_context:
            raise RequestError(f"the prompt is {len(prompt_ids)} tokens, more than the job's context "
                               f"(data.max_prompt_length + data.max_response_length = {self.max_context})",
                               param=field, code="context_length_exceeded")
        room = transcript.room(prompt_ids, self.job.max_tokens)
        if room < 1:
            raise RequestError(f"the episode's transcript fills data.max_response_length = {self.job.max_tokens} "
                               "tokens after its first prompt; answer now", param=field,
                               code="context_length_exceeded")
        budget = min(request.max_tokens, room, self._tokens_left(transcript))
        transcript.in_flight += 1
        transcript.reserved += budget
        try:
            output_ids, log_probs = await self._generate(prompt_ids, budget)
        finally:
            transcript.in_flight -= 1
            transcript.reserved -= budget
        finish = "stop" if output_ids and output_ids[-1] in self.eos_ids else "length"
        text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
        call = Call(prompt_ids, output_ids, log_probs, finish)
        if request.kind == "completion":
            transcript.record(call, text, request, None)
            return completion_body(self.model, text, finish, len(prompt_ids), len(output_ids))
        message, reason = assistant_message(text, with_tools=request.tools is not None)
        transcript.record(call, text, request, _as_request_message(message))
        logprobs = (token_logprobs(self.tokenizer, output_ids, log_probs or [0.0] * len(output_ids))
                    if request.logprobs else None)
        return chat_body(self.model, message, reason if reason and finish == "stop" else finish, len(prompt_ids),
                         len(output_ids), logprobs)

    def _tokens_left(self, transcript: Transcript) -> int:
        """What the episode may still generate under ``rollout.agent.max_tokens``; a refusal at none."""
        limit = self.section.max_tokens
        if limit is None:
            return self.job.max_tokens
        left = limit - transcript.generated - transcript.reserved
        if left < 1:
            raise RequestError(f"the episode has generated rollout.agent.max_tokens = {limit} tokens; answer now",
                               code="episode_token_limit")
        return left

    # -- the engine ---------------------------------------------------------------------------------
    async def _generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float] | None]:
        future = asyncio.get_running_loop().create_future()
        self.phase.pending.append(_Pending(prompt_ids, max_tokens, future))
        self._wake.set()
        return await future

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            phase = self.phase
            if phase is None or not phase.pending:
                continue
            deadline = loop.time() + self.section.batch_wait_s
            while len(phase.pending) < phase.running and loop.time() < deadline:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), deadline - loop.time())
                except TimeoutError:
                    break
            calls, phase.pending = phase.pending, []
            try:
                results = await asyncio.to_thread(self._engine_call, phase, calls)
            except Exception as exc:  # noqa: BLE001 - every waiting call fails with the engine's error
                for call in calls:
                    if not call.future.done():
                        call.future.set_exception(exc)
                continue
            for call, result in zip(calls, results):
                if not call.future.done():
                    call.future.set_result(result)
            if phase.pending:
                self._wake.set()

    def _engine_call(self, phase: Phase, calls: list[_Pending]) -> list[tuple[list[int], list[float] | None]]:
        """One generate call for ``calls``: left-padded prompts, n = 1, the longest budget; each output
        cut to its own call's budget."""
        pad = self.tokenizer.pad_token_id
        width = max(len(c.prompt_ids) for c in calls)
        input_ids = torch.tensor([[pad] * (width - len(c.prompt_ids)) + c.prompt_ids for c in calls])  # (C, W)
        attention = torch.tensor([[0] * (width - len(c.prompt_ids)) + [1] * len(c.prompt_ids) for c in calls])
        sampling = phase.sampling
        seed = None if sampling.seed is None else group_seed(sampling.seed, 20_000 + phase.engine_calls)
        phase.engine_calls += 1
        out = phase.generate(Batch({"input_ids": input_ids, "attention_mask": attention}),
                             attrs.evolve(sampling, n=1, seed=seed, max_new_tokens=max(c.max_tokens for c in calls)))
        results = []
        for row, call in enumerate(calls):
            keep = out["response_mask"][row].bool()
            ids = out["responses"][row][keep].tolist()[:call.max_tokens]
            log_probs = (out["rollout_log_probs"][row][keep].tolist()[:len(ids)] if "rollout_log_probs" in out
                         else None)
            results.append((ids, log_probs))
        return results


def _as_request_message(message: dict) -> dict:
    """The assistant message as a later request repeats it (parsed arguments, text content)."""
    import json

    plain = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        plain["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
            "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in message["tool_calls"]]
    return plain
