"""``serve``: plan, start vLLM, warm it up; prints ``ready: URL`` and watches until stopped.

On several nodes: ``serve`` on the head (node 0), ``serve --node-rank N --head ADDRESS`` on the
others, as the head prints it.
"""

from __future__ import annotations

import argparse

from backend.cli.options import add_engine_port, add_plan_options, fail, port_number
from backend.runtime.processes.process import unwind_on_signals
from config.commands import MASTER_PORT
from config.settings import Settings

NAME = "serve"
HELP = "plan, start vLLM, warm it up; prints 'ready: URL' (several nodes: on each, as the head says)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    add_engine_port(p)
    p.add_argument("--no-warmup", action="store_true", help="skip warm-up (to measure what it saves)")
    g = p.add_argument_group("several nodes")
    g.add_argument("--node-rank", type=int, default=0, help="this node's rank; 0 (default) is the head")
    g.add_argument(
        "--head", metavar="HOST[:PORT]", help="on nodes 1, 2, ...: the head's address, as the head printed it"
    )
    g.add_argument("--master-addr", help="on the head: its address the other nodes reach (default: from its name)")
    g.add_argument(
        "--master-port",
        type=port_number,
        default=MASTER_PORT,
        help=f"on the head: vLLM's rendezvous port (default {MASTER_PORT}); the other nodes join on the next one",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.node_rank < 0:
        fail(f"--node-rank {args.node_rank}: 0 is the head, 1, 2, ... the other nodes")
    if args.node_rank and not args.head:
        fail(f"--node-rank {args.node_rank}: also give --head ADDRESS (the line the head printed)")
    if args.head and not args.node_rank:
        fail("--head: give this node's --node-rank (1, 2, ...); node 0 is the head itself")
    if args.master_port == 65535:
        fail("--master-port 65535: the other nodes join on the port after it; choose 65534 or lower")
    unwind_on_signals()
    if args.node_rank:
        from backend.runtime.multinode.node import run_node

        return run_node(settings, args.node_rank, args.head, model_given=args.model is not None)
    from backend.runtime.serve import run_serve

    return run_serve(settings, master_addr=args.master_addr, master_port=args.master_port)
