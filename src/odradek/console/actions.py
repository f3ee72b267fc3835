"""Operator actions, each behind a confirmation step.

Every action is a form (GET `/actions/<slug>`, fields pre-filled from the query string), then a
confirmation page that says exactly what will be done (POST without `confirmed`), then the
action itself (POST with `confirmed=yes`, the same fields carried as hidden inputs), which talks
the Kafka protocol as Kafka's own tools do: CreateTopics, DeleteTopics, CreatePartitions,
IncrementalAlterConfigs, ElectLeaders (preferred), OffsetCommit through AlterConsumerGroupOffsets
(an inactive group only; the coordinator refuses an active one). The form is validated before the
confirmation (one line per mistake, nothing sent); what the brokers refuse is shown with Kafka's
error name. Nothing is ever done by a GET, and the confirmation carries the console process's
random token: a page of another site that posts to the console (cross-site request forgery)
cannot know it, so it cannot act.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from odradek.console.kafka_client import ConsoleError

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    label: str
    kind: str = "text"  # text, number, select, textarea
    options: tuple[str, ...] = ()
    placeholder: str = ""
    default: str = ""
    required: bool = True


@dataclass(frozen=True, slots=True)
class Plan:
    """A validated action: the parameters to run it with and the sentences that describe it."""

    params: dict[str, Any]
    summary: list[str]


@dataclass(frozen=True, slots=True)
class Action:
    slug: str
    title: str
    fields: tuple[Field, ...]
    plan: Callable[[Mapping[str, str], Any], Plan]
    run: Callable[[Any, dict[str, Any]], Awaitable[tuple[str, str]]]
    danger: bool = False


# -- validation helpers -----------------------------------------------------------------------


def topic_name(text: str) -> str:
    name = text.strip()
    if name in (".", "..") or not TOPIC_NAME.match(name):
        raise ValueError(
            f"Invalid topic name {name!r}: 1-249 characters of ASCII letters, digits, '.', '_'"
            " and '-', and not '.' or '..'"
        )
    return name


def positive_int(text: str, what: str, low: int = 1) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{what} must be a number, not {text.strip()!r}") from None
    if value < low:
        raise ValueError(f"{what} must be at least {low}")
    return value


def parse_configs(text: str) -> dict[str, str]:
    """`name=value` per line (or comma-separated), Kafka's --config syntax."""
    configs: dict[str, str] = {}
    for item in re.split(r"[\n,]", text):
        item = item.strip()
        if not item:
            continue
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"Config {item!r} must be name=value")
        configs[name.strip()] = value.strip()
    return configs


def parse_partitions(text: str, count: int) -> list[int]:
    """`all`/empty or a comma-separated list of partition numbers below `count`."""
    text = text.strip().lower()
    if text in ("", "all"):
        return list(range(count))
    partitions = []
    for item in text.split(","):
        number = positive_int(item, "A partition", low=0)
        if number >= count:
            raise ValueError(f"Partition {number} does not exist (the topic has {count})")
        partitions.append(number)
    return sorted(set(partitions))


def _existing_topic(form: Mapping[str, str], snapshot: Any) -> Any:
    name = topic_name(form.get("topic", ""))
    topic = snapshot.topics.get(name)
    if topic is None:
        raise ValueError(f"Topic {name} does not exist")
    return topic


# -- the actions ------------------------------------------------------------------------------


def _plan_create(form: Mapping[str, str], snapshot: Any) -> Plan:
    name = topic_name(form.get("topic", ""))
    if name in snapshot.topics:
        raise ValueError(f"Topic {name} already exists")
    partitions = positive_int(form.get("partitions", ""), "Partitions")
    replication = positive_int(form.get("replication_factor", ""), "Replication factor")
    configs = parse_configs(form.get("configs", ""))
    summary = [
        f"Create topic {name} with {partitions} partition(s), replication factor {replication}."
    ]
    summary += [f"Config {k}={v}" for k, v in configs.items()]
    return Plan(
        {"name": name, "partitions": partitions, "rf": replication, "configs": configs}, summary
    )


async def _run_create(state: Any, p: dict[str, Any]) -> tuple[str, str]:
    await state.kafka_call(
        state.kafka.create_topic, p["name"], p["partitions"], p["rf"], p["configs"]
    )
    await state.zk.refresh()
    return f"Created topic {p['name']}.", f"/topics/{quote(p['name'])}"


def _plan_delete(form: Mapping[str, str], snapshot: Any) -> Plan:
    topic = _existing_topic(form, snapshot)
    return Plan(
        {"name": topic.name},
        [
            f"Delete topic {topic.name} and its {topic.counts.partitions} partition(s):"
            " every record in it is lost."
        ],
    )


async def _run_delete(state: Any, p: dict[str, Any]) -> tuple[str, str]:
    await state.kafka_call(state.kafka.delete_topic, p["name"])
    await state.zk.refresh()
    return f"Deletion of topic {p['name']} started.", "/topics"


def _plan_add_partitions(form: Mapping[str, str], snapshot: Any) -> Plan:
    topic = _existing_topic(form, snapshot)
    current = topic.counts.partitions
    total = positive_int(form.get("total", ""), "The new partition count")
    if total <= current:
        raise ValueError(f"The new partition count must be above the current {current}")
    return Plan(
        {"name": topic.name, "total": total},
        [
            f"Add {total - current} partition(s) to {topic.name}: {current} -> {total}.",
            "Keyed records will map to different partitions from now on.",
        ],
    )


async def _run_add_partitions(state: Any, p: dict[str, Any]) -> tuple[str, str]:
    await state.kafka_call(state.kafka.add_partitions, p["name"], p["total"])
    await state.zk.refresh()
    return f"{p['name']} now has {p['total']} partitions.", f"/topics/{quote(p['name'])}"


def _plan_alter_config(form: Mapping[str, str], snapshot: Any) -> Plan:
    topic = _existing_topic(form, snapshot)
    name = form.get("name", "").strip()
    if not name or not re.match(r"^[a-z0-9._-]+$", name):
        raise ValueError(f"Invalid config name {name!r}")
    operation = form.get("operation", "set")
    if operation == "delete":
        return Plan(
            {"topic": topic.name, "name": name, "value": None},
            [f"Remove {topic.name}'s override of {name} (back to the broker default)."],
        )
    value = form.get("value", "").strip()
    return Plan(
        {"topic": topic.name, "name": name, "value": value},
        [f"Set {name}={value} on topic {topic.name}."],
    )


async def _run_alter_config(state: Any, p: dict[str, Any]) -> tuple[str, str]:
    await state.kafka_call(state.kafka.alter_topic_config, p["topic"], p["name"], p["value"])
    await state.zk.refresh()
    done = f"Set {p['name']}={p['value']}" if p["value"] is not None else f"Removed {p['name']}"
    return f"{done} on {p['topic']}.", f"/topics/{quote(p['topic'])}"


def _plan_elect(form: Mapping[str, str], snapshot: Any) -> Plan:
    topic = _existing_topic(form, snapshot)
    partitions = parse_partitions(form.get("partitions", ""), topic.counts.partitions)
    moving = [
        p.partition
        for p in topic.partitions
        if p.partition in partitions and p.leader != p.preferred_leader
    ]
    return Plan(
        {"topic": topic.name, "partitions": partitions},
        [
            f"Preferred-leader election for {len(partitions)} partition(s) of {topic.name}.",
            f"Led by another replica than the preferred one now: {moving or 'none'}.",
        ],
    )


async def _run_elect(state: Any, p: dict[str, Any]) -> tuple[str, str]:
    results = await state.kafka_call(
        state.kafka.elect_preferred, [(p["topic"], n) for n in p["partitions"]]
    )
    await state.zk.refresh()
    elected = [k for k, v in results.items() if v == "elected"]
    others = [f"{k}: {v}" for k, v in results.items() if v != "elected"]
    message = f"Elected the preferred leader of {len(elected)} partition(s)."
    if others:
        message += " " + "; ".join(others)
    return message, f"/topics/{quote(p['topic'])}"


def _plan_reset(form: Mapping[str, str], snapshot: Any) -> Plan:
    group = form.get("group", "").strip()
    if not group:
        raise ValueError("A group id is needed")
    topic = _existing_topic(form, snapshot)
    partitions = parse_partitions(form.get("partitions", ""), topic.counts.partitions)
    to = form.get("to", "earliest")
    if to not in ("earliest", "latest", "offset"):
        raise ValueError(f"Unknown reset target {to!r}")
    offset = positive_int(form.get("offset", "0") or "0", "The offset", low=0)
    target = f"offset {offset}" if to == "offset" else f"the {to} offset"
    return Plan(
        {"group": group, "topic": topic.name, "partitions": partitions, "to": to, "offset": offset},
        [
            f"Commit {target} for group {group} on {topic.name} partitions {partitions}"
            " (clamped to each partition's log start and end).",
            "The group must have no active members.",
        ],
    )


async def _run_reset(state: Any, p: dict[str, Any]) -> tuple[str, str]:
    targets = await state.kafka_call(
        state.kafka.reset_group_offsets,
        p["group"],
        p["topic"],
        p["partitions"],
        p["to"],
        p["offset"],
    )
    done = ", ".join(f"{p['topic']}-{n}: {o}" for n, o in sorted(targets.items()))
    return f"Committed offsets for {p['group']}: {done}.", f"/groups/{quote(p['group'])}"


TOPIC_FIELD = Field("topic", "Topic")
ACTIONS: dict[str, Action] = {
    a.slug: a
    for a in (
        Action(
            "create-topic",
            "Create a topic",
            (
                TOPIC_FIELD,
                Field("partitions", "Partitions", "number", default="3"),
                Field("replication_factor", "Replication factor", "number", default="3"),
                Field("configs", "Configs (name=value per line)", "textarea", required=False),
            ),
            _plan_create,
            _run_create,
        ),
        Action("delete-topic", "Delete a topic", (TOPIC_FIELD,), _plan_delete, _run_delete, True),
        Action(
            "add-partitions",
            "Add partitions",
            (TOPIC_FIELD, Field("total", "New partition count", "number")),
            _plan_add_partitions,
            _run_add_partitions,
        ),
        Action(
            "alter-config",
            "Change a topic config",
            (
                TOPIC_FIELD,
                Field("name", "Config name", placeholder="retention.ms"),
                Field("operation", "Operation", "select", ("set", "delete")),
                Field("value", "Value", required=False),
            ),
            _plan_alter_config,
            _run_alter_config,
        ),
        Action(
            "elect-preferred",
            "Preferred-leader election",
            (
                TOPIC_FIELD,
                Field("partitions", "Partitions", placeholder="all or 0,2,5", required=False),
            ),
            _plan_elect,
            _run_elect,
        ),
        Action(
            "reset-offsets",
            "Reset a group's offsets",
            (
                Field("group", "Group"),
                TOPIC_FIELD,
                Field("partitions", "Partitions", placeholder="all or 0,2,5", required=False),
                Field("to", "Reset to", "select", ("earliest", "latest", "offset")),
                Field("offset", "Offset (for 'offset')", "number", required=False),
            ),
            _plan_reset,
            _run_reset,
            True,
        ),
    )
}


def _state(request: Request) -> Any:
    return request.app.state.console


async def action_form(request: Request) -> Response:
    state = _state(request)
    action = ACTIONS.get(request.path_params["slug"])
    if action is None:
        return state.render(request, "error.html", 404, message="No such action.")
    values = {f.name: request.query_params.get(f.name, f.default) for f in action.fields}
    return state.render(request, "action_form.html", action=action, values=values, error=None)


async def action_post(request: Request) -> Response:
    state = _state(request)
    action = ACTIONS.get(request.path_params["slug"])
    if action is None:
        return state.render(request, "error.html", 404, message="No such action.")
    form = await request.form()
    values = {f.name: str(form.get(f.name, "")) for f in action.fields}
    snapshot = await state.zk.refresh()
    try:
        plan = action.plan(values, snapshot)
    except ValueError as e:
        return state.render(
            request, "action_form.html", 400, action=action, values=values, error=str(e)
        )
    if form.get("confirmed") != "yes":
        return state.render(
            request, "confirm.html", action=action, values=values, plan=plan, token=state.token
        )
    if not secrets.compare_digest(str(form.get("token", "")), state.token):
        return state.render(
            request,
            "action_form.html",
            403,
            action=action,
            values=values,
            error="This confirmation did not come from this console's own page: review again.",
        )
    try:
        message, link = await action.run(state, plan.params)
    except ConsoleError as e:
        return state.render(
            request, "action_form.html", 502, action=action, values=values, error=str(e)
        )
    return state.render(request, "result.html", action=action, message=message, link=link)


def routes(extra: Iterable[Action] = ()) -> list[Route]:
    """The actions' routes; `extra`: actions that other page modules define (ACLs,
    transactions), served beside these under /actions/<slug>."""
    ACTIONS.update((a.slug, a) for a in extra)
    return [
        Route("/actions/{slug}", action_form, methods=["GET"]),
        Route("/actions/{slug}", action_post, methods=["POST"]),
    ]
