"""Per-model workers: a model's generations run one at a time, the others wait in a bounded queue.

A request handler submits a Job and reads its items: 'started' once the model is loaded, the
prompt built and the first round decoded (so a bad prompt is still a 4xx, not a broken stream),
then one 'event' per draft/verify round. Setting `job.cancel` (the handler does it when its client
goes away) stops the generation at the next round, or skips the job if it is still queued.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from ..engine import Engine, Event
from ..errors import MlxspecError, PromptError
from ..options import GenerateOptions
from ..store import Manifest
from .registry import Registry
from .requests import ApiError

log = logging.getLogger("mlxspec.server")


@dataclass
class Job:
    name: str
    manifest: Manifest
    build_prompt: Callable[[Engine], list[int]]  # runs on the MLX thread: templates need the tokenizer
    options: GenerateOptions
    keep_alive: float | None = None  # seconds; None: the server's default
    format: str | dict | None = None  # structured output: "json" or a JSON schema (checked when the request came)
    cancel: threading.Event = field(default_factory=threading.Event)
    received: float = field(default_factory=time.perf_counter)
    load_seconds: float = 0.0
    prompt_ids: list[int] = field(default_factory=list)
    token_bytes: Callable[[int], bytes] | None = None  # the model's, once it is loaded (logprobs show tokens)
    items: asyncio.Queue = field(default_factory=asyncio.Queue)

    def put(self, kind: str, value=None) -> None:
        self.items.put_nowait((kind, value))

    async def started(self) -> None:
        """Wait for the model, the prompt and the first round; raises what went wrong instead."""
        kind, value = await self.items.get()
        if kind == "error":
            raise value

    async def events(self) -> AsyncIterator[Event]:
        """The generation's events; the last has done=True. A failure mid-way is raised."""
        while True:
            kind, value = await self.items.get()
            if kind == "error":
                raise value
            yield value
            if value.done:
                return


class Scheduler:
    def __init__(self, registry: Registry, max_queue: int):
        self.registry = registry
        self.max_queue = max_queue
        self.queues: dict[str, asyncio.Queue] = {}
        self.workers: dict[str, asyncio.Task] = {}

    def submit(self, job: Job) -> Job:
        queue = self.queues.get(job.name)
        if queue is None:
            queue = self.queues[job.name] = asyncio.Queue(maxsize=self.max_queue)
            self.workers[job.name] = asyncio.ensure_future(self._work(queue))
        try:
            queue.put_nowait(job)
        except asyncio.QueueFull:
            raise ApiError(
                503, f"server busy: {self.max_queue} requests already wait for {job.name} (MLXSPEC_MAX_QUEUE); retry later"
            ) from None
        return job

    @asynccontextmanager
    async def session(self, job: Job):
        """Submit `job` and wait until it started; leaving the block (the client left) cancels it."""
        self.submit(job)
        try:
            await job.started()
            yield job
        finally:
            job.cancel.set()  # a no-op once the generation is done

    def waiting(self, name: str) -> int:
        queue = self.queues.get(name)
        return queue.qsize() if queue else 0

    async def _work(self, queue: asyncio.Queue) -> None:
        while True:
            job = await queue.get()
            if job.cancel.is_set():
                continue  # its client left while it waited
            try:
                await self._run(job)
            except Exception as e:  # every failure reaches the request that caused it
                if not isinstance(e, (ApiError, MlxspecError)):  # not the caller's doing
                    log.exception("generation for %s failed", job.name)
                job.put("error", e)

    async def _run(self, job: Job) -> None:
        entry, job.load_seconds = await self.registry.acquire(job.name, job.manifest)
        try:
            engine = entry.engine
            job.token_bytes = engine.token_bytes
            # Templates render on a worker thread, time-limited: a slow one never holds the MLX thread.
            job.prompt_ids = await asyncio.get_running_loop().run_in_executor(None, job.build_prompt, engine)
            gen = engine.generate(job.prompt_ids, job.options, cancel=job.cancel, format=job.format)
            try:
                try:
                    first = await self.registry.run(next, gen, None)
                except PromptError as e:  # the engine refuses an empty or too long prompt
                    raise ApiError(400, str(e)) from None
                job.put("started")
                event = first
                while event is not None:
                    job.put("event", event)
                    if event.done:
                        break
                    event = await self.registry.run(next, gen, None)
            finally:
                await self.registry.run(gen.close)
        finally:
            self.registry.release(entry, job.keep_alive)

    async def close(self) -> None:
        for task in self.workers.values():
            task.cancel()
        await asyncio.gather(*self.workers.values(), return_exceptions=True)

