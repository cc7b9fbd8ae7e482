"""mc bank: the bank (project) tree with shares, usage and fair-share factors; add and remove (instance owner)."""
from __future__ import annotations

from typing import Any

from minicluster.cli.argparser import Parser
from minicluster.cli.format import dumps, print_table, table, user_name
from minicluster.cli.options import non_negative_int
from minicluster.client import Client

HELP = "banks: list | add BANK [--parent P] [--shares N] | add BANK --user U [--default] | remove BANK [--user U]"


def main(argv: list[str]) -> int:
    parser = Parser(prog="mc bank", description=HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = sub.add_parser("list", help="the tree in fair-share order: shares, usage, factors")
    listing.add_argument("--json", action="store_true", help="print the broker's answer (protocol.md §3.10)")
    add = sub.add_parser("add", help="create or change a bank, or add a user to one (instance owner)")
    add.add_argument("bank", metavar="BANK")
    add.add_argument("--parent", default="root", metavar="BANK", help="the bank above it (default: root)")
    add.add_argument("--shares", type=non_negative_int, default=1, metavar="N", help="its shares (default 1)")
    add.add_argument("--user", metavar="USER", help="add this user (login name or uid) to BANK instead")
    add.add_argument("--default", action="store_true", help="with --user: make BANK the user's default")
    remove = sub.add_parser("remove", help="remove a bank, or a user from it (instance owner)")
    remove.add_argument("bank", metavar="BANK")
    remove.add_argument("--user", metavar="USER", help="remove only this user from BANK")
    args = parser.parse_args(argv)
    with Client() as client:
        if args.command == "add":
            if args.default and args.user is None:
                parser.error("add: --default needs --user")
            client.bank_add(args.bank, parent=args.parent, shares=args.shares, user=_user(args.user),
                            default=args.default)
            return 0
        if args.command == "remove":
            client.bank_remove(args.bank, user=_user(args.user))
            return 0
        nodes = client.banks()
    if args.json:
        print(dumps({"banks": nodes}))
    else:
        print_table(bank_table(nodes))
    return 0


def _user(text: str | None) -> int | str | None:
    return int(text) if text is not None and text.isdigit() else text


def bank_table(nodes: list[dict[str, Any]]) -> Any:
    """The tree, indented by depth, in the order Fair Tree ranks it."""
    depth: dict[str, int] = {"root": 0}
    t = table("BANK/USER", "SHARES", "NORM SHARES", "USAGE (core-s)", "LEVEL FS", "FAIRSHARE")
    for node in nodes:
        level = depth.get(node["parent"], 0) + 1
        if "uid" in node:
            label = "  " * level + user_name(node["uid"]) + (" (default)" if node.get("default") else "")
            fairshare = f"{node['fairshare']:.3f}"
        else:
            depth[node["name"]] = level
            label = "  " * (level - 1) + node["name"] + (" [config]" if node.get("config") else "")
            fairshare = ""
        level_fs = "inf" if node.get("level_fs") is None else f"{node['level_fs']:.3f}"
        t.add_row(label, str(node["shares"]), f"{node['norm_shares']:.3f}", f"{node['usage']:.0f}", level_fs,
                  fairshare)
    return t
