"""The console's ASGI application: state, lifespan and routes (Starlette, Jinja2, uvicorn).

`create_app(settings)` builds it; `serve(settings)` runs it under uvicorn until SIGINT/SIGTERM.
The pages are in `pages` (reads) and `actions` (operator actions behind a confirmation step);
the ACLs and transactions pages, with their actions, in `acl_pages` and `transaction_pages`.

Concurrency: everything runs on uvicorn's one event loop; blocking client calls (confluent-kafka)
go to worker threads through `ConsoleState.kafka_call`; the asyncio admin clients of the ACL and
transactions pages (`admin_access`), of the topic and group pages' high watermarks
(`leader_offsets`) and of the record browser (`record_browser`) run on the loop itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from odradek.console import (
    acl_pages,
    actions,
    controller_view,
    history,
    pages,
    transaction_pages,
    views,
)
from odradek.console.assets import vendor_directory
from odradek.console.broker_metrics import MetricsSampler
from odradek.console.kafka_client import ConsoleError, KafkaAccess
from odradek.console.leader_offsets import LeaderOffsets
from odradek.console.record_browser import RecordBrowser
from odradek.console.zk_view import ZkView
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).resolve().parent / "templates"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    bootstrap_servers: str
    zookeeper: str
    metrics: Mapping[int, str] = field(default_factory=dict)
    client_config: Mapping[str, str] = field(default_factory=dict)  # librdkafka's names
    security: ClientSecurity = PLAINTEXT_CLIENT  # the same settings, for odradek.admin's clients
    host: str = "127.0.0.1"
    port: int = 8080
    refresh_s: float = 2.0
    metrics_interval_s: float = 5.0


class ConsoleState:
    """What every handler reaches through `request.app.state.console`."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.zk = ZkView(settings.zookeeper, known_broker_ids=settings.metrics)
        self.metrics = MetricsSampler(settings.metrics, settings.metrics_interval_s)
        self.kafka = KafkaAccess(settings.bootstrap_servers, settings.client_config)
        # The topic and group pages' high watermarks and the record browser: requests at the
        # leaders ZooKeeper names, on kept connections.
        self.leader_offsets = LeaderOffsets(settings.bootstrap_servers, self.zk, settings.security)
        self.records = RecordBrowser(self.leader_offsets)
        self.vendor = vendor_directory()
        self.token = secrets.token_urlsafe(24)  # the actions' confirmation token (CSRF)
        self.templates = Environment(
            loader=FileSystemLoader(TEMPLATES),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.globals.update(
            human_bytes=views.human_bytes,
            human_rate=views.human_rate,
            sparkline=views.sparkline,
            refresh_ms=int(settings.refresh_s * 1000),
            htmx=self.vendor is not None,
            bootstrap=settings.bootstrap_servers,
            zookeeper=settings.zookeeper,
        )
        self.templates.filters["clock"] = lambda ts: (
            time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"
        )
        self.templates.filters["datetime_ms"] = lambda ms: (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"
            if ms is not None
            else "-"
        )

    def compile_templates(self) -> None:
        """Compile every template now (~0.2 s), not on the first request for it: a page's first
        fetch would otherwise pay for its templates (~35 ms for a topic page, more when the
        machine is busy)."""
        for name in self.templates.list_templates():
            self.templates.get_template(name)

    async def kafka_call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(function, *args, **kwargs)

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        context.setdefault("zk_error", self.zk.last_error)
        context["request"] = request
        context["path"] = request.url.path
        text = self.templates.get_template(template).render(**context)
        return HTMLResponse(text, status_code=status_code)

    async def learn_min_insync_replicas(self) -> None:
        """The brokers' `min.insync.replicas` (a topic without an override uses it), asked of
        the controller once; 1 (Kafka's default) until it answers."""
        with contextlib.suppress(ConsoleError, OSError, ValueError):
            snapshot = await self.zk.current()
            broker = snapshot.controller_id
            if broker is None:
                return
            value = await self.kafka_call(self.kafka.broker_config, broker, "min.insync.replicas")
            if value is not None and int(value) != self.zk.default_min_insync_replicas:
                self.zk.default_min_insync_replicas = int(value)
                await self.zk.refresh()


def create_app(settings: ConsoleSettings) -> Starlette:
    state = ConsoleState(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.compile_templates()
        await state.zk.start()
        learner = asyncio.create_task(state.learn_min_insync_replicas())
        try:
            yield
        finally:
            learner.cancel()
            with contextlib.suppress(BaseException):
                await learner
            state.leader_offsets.close()
            await state.zk.close()

    routes: list[Any] = [
        Route("/", pages.overview),
        Route("/fragments/overview", pages.overview_fragment),
        Route("/topics", pages.topics),
        Route("/topics/{name}", pages.topic),
        Route("/topics/{name}/partitions", pages.topic_partitions),
        Route("/topics/{name}/records", pages.records),
        Route("/topics/{name}/partitions/{partition:int}", history.partition_history),
        Route("/controller", controller_view.controller_page),
        Route("/groups", pages.groups),
        Route("/groups/{group_id}", pages.group),
        Route("/reassignments", pages.reassignments),
        Route("/health", pages.health),
        *acl_pages.routes(),
        *transaction_pages.routes(),
        *actions.routes(acl_pages.ACTIONS + transaction_pages.ACTIONS),
    ]
    if state.vendor is not None:
        routes.append(Mount("/static/vendor", StaticFiles(directory=state.vendor), name="vendor"))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.console = state
    return app


def serve(settings: ConsoleSettings) -> int:
    """Run the console until SIGINT or SIGTERM (uvicorn handles both)."""
    import uvicorn

    app = create_app(settings)
    if app.state.console.vendor is None:
        log.warning(
            "htmx is not installed (./dev setup installs it): pages work, without live updates"
        )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
