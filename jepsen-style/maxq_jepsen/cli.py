"""`jepsen-style/run`: run a profile (or re-check histories) and print the verdicts.

Theory of operation: build the list of RunSpecs from the profile and the overrides, run them one
after another into a fresh folder under the store (`jepsen-style/store/<time>-<profile>/`,
git-ignored; `store/latest` points at it), write the report, and print the summary table, the
details and, as the very last line, the one-line summary. Exit 0 on PASS, 1 on FAIL (a fatal
verdict), 3 on UNKNOWN (the run cannot vouch for its counts), 2 on bad options.

`--check HISTORY...` re-runs the checker (and redraws the timelines) on existing histories.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from .checker import FAILED, PASS, check
from .history import read_history, run_meta
from .lab import netns_available
from .nemesis import OVERLAPPABLE, NemesisError, parse_nemeses, unsupported
from .profiles import PROFILES, WORKLOAD_KINDS, RunSpec, get_profile, workload_for
from .report import overall_verdict, run_details, summary_line, summary_table, write_run_report, write_summary
from .runner import Run, discard_data

HERE = Path(__file__).resolve().parent.parent  # jepsen-style/
DEFAULT_STORE = HERE / "store"
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_UNKNOWN = 0, 1, 2, 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jepsen-style/run", description="Jepsen-style fault tests of MaxQ-Raft.")
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="ci",
        help="ci (default): 2 single-node runs of ~30 s + one 3-node cluster run of ~60 s; "
        "cluster: that cluster run alone; long: 11 five-node runs over every nemesis (the 11th "
        "with the dlx workload), then 10 single-node runs, 300 s each (--runs 6: the first six "
        "five-node runs, ~35 min)",
    )
    p.add_argument("--seed", type=int, help="seed of the first run (the next runs take seed+1, ...)")
    p.add_argument("--runs", type=int, help="number of runs (default: the profile's)")
    p.add_argument(
        "--from-run",
        type=int,
        metavar="K",
        help="start at the profile's K-th run (1-based; default 1): a long profile, such as the "
        "campaign, stopped after run K-1 goes on where it stopped, with the same seeds",
    )
    p.add_argument(
        "--nemesis",
        help="comma list: kill, kill-leader, kill-majority, pause, pause-leader, partition-one, "
        "partition-leader, partition-halves, one-way, bridge, partition-majorities-ring, "
        "loss, delay, disk-stall, disk-full, clock-skew, membership; 'none' or 'all' "
        "(default: the profile's)",
    )
    p.add_argument(
        "--overlap",
        help="comma-separated, of membership, disk-full, maintenance, move: these run during the other "
        "faults instead of in cycles of their own; 'none' turns it off (default: the profile's)",
    )
    p.add_argument("--time", type=float, dest="time_s", help="seconds of workload per run (default: the profile's)")
    p.add_argument(
        "--quiet-s", type=_range, metavar="MIN:MAX", help="quiet seconds before each fault (default: the profile's)"
    )
    p.add_argument(
        "--fault-s", type=_range, metavar="MIN:MAX", help="seconds each fault lasts (default: the profile's)"
    )
    p.add_argument(
        "--workload",
        choices=WORKLOAD_KINDS,
        help="queue: several publishers/consumers; fifo: one of each; dlx: a work queue with a short "
        "message TTL dead-lettering to a second queue, consumers on both; sqs: boto3 senders and "
        "receivers over the members' SQS endpoints (receive, delete most, let some visibilities run out); "
        "txn: transactional halves (1-3 per transaction) to a deduplicating queue, committed, rolled back "
        "or left to a check-back that a responder answers; half publishes retried after a lost confirm "
        "(--rate is then transactions per second per publisher)",
    )
    p.add_argument("--ttl-ms", type=int, help="the dlx workload's x-message-ttl in ms (default 300)")
    p.add_argument("--rate", type=float, help="publishes per second per publisher")
    p.add_argument("--publishers", type=int)
    p.add_argument("--consumers", type=int)
    p.add_argument("--nodes", type=int, help="nodes in the lab: 1 (a plain node) or 3..9 (a cluster)")
    p.add_argument("--shards", type=int, help="shard groups of a cluster (default 2)")
    p.add_argument(
        "--lab",
        choices=("local", "netns"),
        help="local: processes on 127.0.0.1; netns: one network namespace per node (root; partitions)",
    )
    p.add_argument("--server-arg", action="append", default=[], help="extra maxq-server argument (repeatable)")
    p.add_argument(
        "--unsafe-confirm-early",
        action="store_true",
        help="DELIBERATELY WRONG client: count a publish as confirmed when sent (to see the checker catch losses)",
    )
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help="output folder (default jepsen-style/store)")
    p.add_argument("--keep-data", action="store_true", help="keep node data folders of passing runs too")
    p.add_argument("--check", nargs="+", type=Path, metavar="HISTORY", help="only check these history files")
    args = p.parse_args(argv)
    if args.runs is not None and not 1 <= args.runs <= 1000:
        p.error("--runs must be 1..1000")
    if args.from_run is not None and not 1 <= args.from_run <= len(get_profile(args.profile).runs):
        p.error(f"--from-run must be 1..{len(get_profile(args.profile).runs)} (the {args.profile} profile's runs)")
    if args.time_s is not None and not 1 <= args.time_s <= 86400:
        p.error("--time must be 1..86400 seconds")
    if args.nodes is not None and not (args.nodes == 1 or 3 <= args.nodes <= 9):
        p.error("--nodes must be 1 or 3..9")
    if args.shards is not None and not 1 <= args.shards <= 64:
        p.error("--shards must be 1..64")
    if args.ttl_ms is not None and not 0 <= args.ttl_ms <= 2**32 - 1:
        p.error("--ttl-ms must be 0..4294967295")
    return args


def _range(text: str) -> tuple[float, float]:
    low, sep, high = text.partition(":")
    try:
        pair = (float(low), float(high if sep else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX seconds") from None
    if not 0 < pair[0] <= pair[1] <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < MIN <= MAX <= 3600")
    return pair


def build_specs(args: argparse.Namespace) -> list[RunSpec]:
    profile = get_profile(args.profile)
    base = list(profile.runs)
    first = (args.from_run or 1) - 1
    count = args.runs or len(base) - first
    specs = []
    for i in range(first, first + count):
        spec = base[i % len(base)]
        changes: dict = {}
        if args.seed is not None:
            changes["seed"] = args.seed + i - first
        elif i >= len(base):
            changes["seed"] = spec.seed + 1000 * (i // len(base))
        if args.nemesis is not None:
            changes["nemeses"] = tuple(parse_nemeses(args.nemesis))
        if args.time_s is not None:
            changes["time_s"] = args.time_s
            changes["tail_s"] = min(spec.tail_s, args.time_s / 4)
        if args.quiet_s is not None:
            changes["quiet_s"] = args.quiet_s
        if args.fault_s is not None:
            changes["fault_s"] = args.fault_s
        workload = spec.workload
        kind = args.workload or spec.workload_kind
        if args.workload and args.workload != spec.workload_kind:
            workload = workload_for(kind, profile.runs[0].workload)
        if args.ttl_ms is not None:
            if kind != "dlx":
                raise ValueError("--ttl-ms is for the dlx workload (--workload dlx)")
            workload = replace(workload, message_ttl_ms=args.ttl_ms)
        overrides = {
            k: v
            for k, v in (
                ("rate_per_publisher_hz", args.rate),
                ("publishers", args.publishers),
                ("consumers", args.consumers),
            )
            if v is not None
        }
        if args.unsafe_confirm_early:
            overrides["unsafe_confirm_early"] = True
        changes["workload"] = replace(workload, **overrides)
        changes["workload_kind"] = kind
        if args.nodes is not None:
            changes["nodes"] = args.nodes
        if args.lab is not None:
            changes["lab"] = args.lab
        if args.shards is not None:
            changes["shards"] = args.shards
        if args.overlap is not None:
            changes["overlap"] = tuple(parse_overlap(args.overlap))
        if args.server_arg:
            changes["server_args"] = tuple(args.server_arg)
        spec = replace(spec, **changes)
        refused = unsupported(list(spec.nemeses), spec.nodes, spec.lab)
        if refused and args.nemesis is not None and args.nemesis.strip() != "all":
            raise NemesisError("; ".join(f"{name}: {why}" for name, why in refused.items()))
        if refused:  # loudly, on both streams: a nemesis that does not run must never look like a pass
            text = f"WARNING: run {i + 1} ({spec.nodes} node(s), {spec.lab} lab) leaves out " + "; ".join(
                f"{name} ({why})" for name, why in refused.items()
            )
            print(text, file=sys.stderr)
            print(text)
        spec = replace(spec, nemeses=tuple(n for n in spec.nemeses if n not in refused))
        idle = [name for name in spec.overlap if name not in spec.nemeses]
        if idle and args.overlap is not None and args.overlap.strip() != "none":
            # (an overlap rides along the run's own nemeses only: asked for and silently not run,
            # it would look like a pass with it)
            raise NemesisError(
                f"--overlap {', '.join(idle)}: not among this run's nemeses ({', '.join(spec.nemeses)}); "
                "add it to --nemesis"
            )
        specs.append(spec)
    return specs


def parse_overlap(spec: str) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if names == ["none"]:
        return []
    bad = [n for n in names if n not in OVERLAPPABLE]
    if bad:
        raise NemesisError(f"--overlap takes {', '.join(OVERLAPPABLE)} or none, not {', '.join(bad)}")
    return names


def fall_back_from_netns(specs: list[RunSpec]) -> tuple[list[RunSpec], str | None]:
    """docs/reliability.md ("What the machine offers"): when namespaces do not work, say so loudly
    and use the loopback lab (without the nemeses that cut links), never a silent pass."""
    if not any(s.lab == "netns" for s in specs):
        return specs, None
    ok, why = netns_available()
    if ok:
        return specs, None
    out = []
    for spec in specs:
        if spec.lab == "netns":
            dropped = unsupported(list(spec.nemeses), spec.nodes, "local")
            spec = replace(spec, lab="local", nemeses=tuple(n for n in spec.nemeses if n not in dropped))
        out.append(spec)
    return out, (
        f"WARNING: network namespaces are not available here ({why}): the cluster runs use the loopback "
        f"lab WITHOUT partitions (kills and pauses only)"
    )


def exit_code(verdict: str) -> int:
    return {PASS: EXIT_PASS, FAILED: EXIT_FAIL}.get(verdict, EXIT_UNKNOWN)


def check_only(paths: list[Path]) -> int:
    results = []
    for path in paths:
        records = read_history(path)
        meta = run_meta(records)
        spec = meta.get("spec", {})
        result = {
            "seed": spec.get("seed"),
            "workload": spec.get("workload_kind"),
            "nemeses": spec.get("nemeses", []),
            "faults": len(meta.get("schedule", [])),
            "history": str(path),
            **check(records).to_dict(),
        }
        write_run_report(result, records, path.parent)
        results.append(result)
    print(summary_table(results))
    for line in (line for r in results for line in run_details(r)):
        print(line)
    print(summary_line(results))
    return exit_code(overall_verdict(results))


def _terminate(signum, _frame) -> None:
    # SIGTERM unwinds like Ctrl-C, through the runner's finally blocks that stop the nodes.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    if args.check:
        return check_only(args.check)
    try:
        specs = build_specs(args)
    except (NemesisError, ValueError) as exc:
        print(f"jepsen-style/run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    specs, fallback = fall_back_from_netns(specs)
    profile = get_profile(args.profile)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.store / f"{stamp}-{args.profile}{'-unsafe' if args.unsafe_confirm_early else ''}"
    suffix = 1
    while out_dir.exists():  # two runs in the same second
        suffix += 1
        out_dir = out_dir.with_name(f"{stamp}-{args.profile}-{suffix}")
    out_dir.mkdir(parents=True)
    _point_latest(args.store, out_dir)
    shapes = sorted({f"{s.nodes} node{'s' if s.nodes > 1 else ''} ({s.lab} lab)" for s in specs})
    print(f"profile {args.profile}: {len(specs)} run(s), {', '.join(shapes)}; output {out_dir}")
    if fallback:
        print(fallback)
    for note in profile.notes:
        print(f"note: {note}")
    if args.unsafe_confirm_early:
        print(
            "WARNING: --unsafe-confirm-early: the client counts publishes as confirmed when sent; losses are expected"
        )
    sys.stdout.flush()
    results, svgs = [], []
    for i, spec in enumerate(specs, 1):
        run_dir = out_dir / f"run-{i}-seed-{spec.seed}"
        print(
            f"run {i}/{len(specs)}: seed {spec.seed}, {spec.nodes} node(s) {spec.lab} lab, {spec.workload_kind} "
            f"workload, nemeses {'+'.join(spec.nemeses) or 'none'}, {spec.time_s:g} s ...",
            flush=True,
        )
        result = Run(spec, run_dir, profile=args.profile).execute()
        records = read_history(result["history"])
        svgs.append(write_run_report(result, records, run_dir))
        c = result["counts"]
        # The sqs workload's own verdict and figures (checker.received_after_delete).
        deletes = (
            f"received_after_delete={c['received_after_delete']} deletes_ok={c['deletes_ok']} "
            f"deletes_certain={c['deletes_certain']} "
            if "deletes_ok" in c
            else ""
        )
        # The txn workload's own verdict and figures (checker: rolled_back_delivered, committed_lost, txn_duplicates).
        if "txns" in c:
            deletes += (
                f"txns={c['txns']} committed={c['txns_committed']} rolled_back={c['txns_rolled_back']} "
                f"checked_back={c['txns_checked_back']} rolled_back_delivered={c['rolled_back_delivered']} "
                f"committed_lost={c['committed_lost']} txn_duplicates={c['txn_duplicates']} "
                f"half_retries={c['half_retries']} "
            )
        print(
            f"run {i}/{len(specs)}: {result['verdict']} published={c['published']} confirmed={c['confirmed']} "
            f"lost={c['lost']} unexpected={c['unexpected']} duplicates={c['duplicates']} {deletes}"
            f"elapsed={result['elapsed_s']}s",
            flush=True,
        )
        if result["verdict"] == PASS and not args.keep_data:
            discard_data(run_dir, spec.nodes)
        results.append(result)
    header = {"profile": args.profile, "store": str(out_dir), "specs": [s.to_dict() for s in specs]}
    write_summary(results, svgs, out_dir, header)
    print()
    print(summary_table(results))
    for line in (line for r in results for line in run_details(r)):
        print(line)
    print(f"report: {out_dir / 'report.html'}  results: {out_dir / 'results.json'}")
    print(summary_line(results))
    return exit_code(overall_verdict(results))


def _point_latest(store: Path, out_dir: Path) -> None:
    link = store / "latest"
    try:
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(out_dir.name, link)
    except OSError:
        pass  # a convenience only
