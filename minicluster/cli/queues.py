"""mc queue: list the queues, show their state and users, start/stop/enable/disable them (as `flux queue`)."""
from __future__ import annotations

from typing import Any

from minicluster.cli.argparser import Parser
from minicluster.cli.format import dumps, print_table, table, user_name
from minicluster.client import Client
from minicluster.model.text import printable

HELP = "queues: list, status [QUEUE], start|stop|enable|disable [QUEUE... | --all]"
ACTIONS = {
    "start": "schedule the queues' jobs again",
    "stop": "stop scheduling the queues' jobs (still accepting new ones)",
    "enable": "accept new jobs in the queues again",
    "disable": "refuse new jobs in the queues (the queued ones still run)",
}


def main(argv: list[str]) -> int:
    parser = Parser(prog="mc queue", description=HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = sub.add_parser("list", help="one line per queue: state, depth, running, limits")
    listing.add_argument("--json", action="store_true", help="print the broker's answer (protocol.md §3.10)")
    status = sub.add_parser("status", help="each queue's state, counts, limits and users")
    status.add_argument("queues", nargs="*", metavar="QUEUE")
    status.add_argument("--json", action="store_true")
    for action, help_ in ACTIONS.items():
        control = sub.add_parser(action, help=help_)
        control.add_argument("queues", nargs="*", metavar="QUEUE")
        control.add_argument("--all", action="store_true", help="every queue")
        if action in ("stop", "disable"):
            control.add_argument("--reason", default="", metavar="TEXT", help="shown by mc queue list")
    args = parser.parse_args(argv)
    with Client() as client:
        if args.command in ACTIONS:
            if not args.queues and not args.all:
                parser.error(f"{args.command}: name the queues, or give --all")
            changed = client.queue_control(args.command, args.queues, getattr(args, "reason", ""))
            for name in changed:
                print(f"{name}: {_state_word(args.command)}")
            return 0
        info = client.queues()
    if args.command == "status" and args.queues:
        unknown = sorted(set(args.queues) - {q["name"] for q in info["queues"]})
        if unknown:
            parser.error(f"no queue {', '.join(unknown)} (queues: {', '.join(q['name'] for q in info['queues'])})")
        info["queues"] = [q for q in info["queues"] if q["name"] in args.queues]
    if args.json:
        print(dumps(info))
    elif args.command == "list":
        print_table(queue_table(info["queues"]))
    else:
        for queue in info["queues"]:
            print("\n".join(printable(line) for line in status_lines(queue)))
    return 0


def _state_word(action: str) -> str:
    return {"start": "started", "stop": "stopped", "enable": "enabled", "disable": "disabled"}[action]


def state_text(queue: dict[str, Any]) -> str:
    """`enabled,started`-style words: what the queue does now."""
    accepting = "enabled" if queue.get("enabled") else "disabled"
    scheduling = "started" if queue.get("started") else "stopped"
    return f"{accepting},{scheduling}"


def limits_text(limits: dict[str, int]) -> str:
    names = {"running_jobs": "run", "cores": "cores", "gpus": "gpus", "queued_jobs": "queued"}
    return ",".join(f"{names[k]}={v}" for k, v in limits.items() if v) or "-"


def queue_table(queues: list[dict[str, Any]]) -> Any:
    t = table("QUEUE", "STATE", "PRIO", "PENDING", "RUNNING", "CORES", "GPUS", "LIMITS", "USER LIMITS", "TIME",
              "PREEMPT")
    for q in queues:
        name = q["name"] + ("*" if q.get("default") else "")
        state = state_text(q) + (f" ({q['reason']})" if q.get("reason") else "")
        limit = q.get("max_time_limit") or 0
        preempt = q["preempt_mode"] if q.get("preemptible") else "-"
        t.add_row(name, state, str(q["priority"]), str(q["pending"]), str(q["running"]), str(q["cores"]),
                  str(q["gpus"]), limits_text(q["limits"]), limits_text(q["user_limits"]),
                  f"{limit:g}s" if limit else "-", preempt)
    return t


def status_lines(queue: dict[str, Any]) -> list[str]:
    lines = [f"{queue['name']}{' (default)' if queue.get('default') else ''}: {state_text(queue)}"
             + (f": {queue['reason']}" if queue.get("reason") else ""),
             f"  priority {queue['priority']}, {queue['pending']} pending, {queue['running']} running, "
             f"{queue['cores']} cores and {queue['gpus']} GPUs in use",
             f"  limits: {limits_text(queue['limits'])}; per user: {limits_text(queue['user_limits'])}"]
    if queue.get("requires"):
        lines.append(f"  nodes: {' '.join(queue['requires'])}")
    if queue.get("preemptible"):
        lines.append(f"  preemptible by higher-priority queues ({queue['preempt_mode']})")
    for user in queue.get("users") or []:
        lines.append(f"  {user_name(user['uid'])}: {user['pending']} pending, {user['running']} running, "
                     f"{user['cores']} cores, {user['gpus']} GPUs")
    return lines
