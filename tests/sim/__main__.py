"""The simulation's command line.

  python -m tests.sim --seed 1234            one seed, with its step log (a failing seed's replay)
  python -m tests.sim --seeds 5000           seeds 0..4999 (--first to start elsewhere)
  python -m tests.sim --seeds 1000000 --workers 2
  python -m tests.sim --seeds 20000 --workers 2 --plant held-replaced   (a bug put back: plants.py)
  python -m tests.sim --seeds 2000 --sqs      with SQS receives in the workload (a seed's run differs)
  python -m tests.sim --seeds 2000 --partial  every run with groups on a few nodes (layout.py)

Run it from the repository root with the project's environment (scripts/sim does both).
Exit status 1 when a seed failed; each failing seed is printed with the command that replays it.
"""

from __future__ import annotations

import argparse
import signal
import sys

from .plants import PLANTS
from .runner import replay_command, run_seed, run_seeds

TAIL_LINES = 60


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, help="run this one seed and print its step log")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds (default 1000)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--steps", type=int, help="steps per seed (default: drawn from the seed)")
    parser.add_argument("--quiet", action="store_true", help="with --seed: only the verdict")
    parser.add_argument("--plant", choices=sorted(PLANTS), help="put a bug the simulation found back (plants.py)")
    parser.add_argument("--sqs", action="store_true", help="SQS receives in the workload too (workload.py)")
    parser.add_argument(
        "--partial", action="store_true", help="groups on a few nodes in every run (else as each seed draws)"
    )
    parser.add_argument("--progress-s", type=float, default=10.0, help="seconds between progress lines (stderr)")
    args = parser.parse_args(argv)
    # A TERM ends the run like ^C: the worker pool is torn down on the way out (no orphans).
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))

    if args.seed is not None:
        outcome, world = run_seed(
            args.seed, tracing=True, steps=args.steps, plant=args.plant, sqs=args.sqs, partial=args.partial or None
        )
        if not args.quiet:
            print("\n".join(world.lines or ()))
        print(f"seed {args.seed}: {'ok' if outcome.ok else 'FAILED: ' + outcome.error} ({outcome.steps} steps)")
        return 0 if outcome.ok else 1

    shown = [0.0]

    def progress(ran: int, failures: list, seconds: float) -> None:
        if seconds - shown[0] >= args.progress_s or ran == args.seeds:
            shown[0] = seconds
            print(
                f"  {ran} seeds, {len(failures)} failed, {seconds:.1f} s ({ran / max(seconds, 1e-9):.0f} seeds/s)",
                file=sys.stderr,
                flush=True,
            )

    noted: list = []
    ran, failures, seconds = run_seeds(
        args.first,
        args.seeds,
        workers=args.workers,
        progress=progress,
        plant=args.plant,
        sqs=args.sqs,
        partial=args.partial or None,
        noted=noted,
    )
    for outcome in failures:
        print(
            f"seed {outcome.seed} FAILED at step {outcome.steps}: {outcome.error}\n"
            f"  replay: {replay_command(outcome.seed, args.sqs, args.partial)}"
        )
    if noted:
        print(
            f"{len(noted)} seeds passed with a known finding (checks.KNOWN_FINDINGS), the first: "
            f"{replay_command(noted[0].seed, args.sqs, args.partial)}\n  {noted[0].known[0]}"
        )
    if failures:
        first = failures[0].seed
        _outcome, world = run_seed(
            first, tracing=True, steps=args.steps, plant=args.plant, sqs=args.sqs, partial=args.partial or None
        )
        lines = world.lines or []
        print(
            f"--- the last {min(len(lines), TAIL_LINES)} lines of seed {first}'s step log "
            f"(all of it: {replay_command(first, args.sqs, args.partial)})"
        )
        print("\n".join(lines[-TAIL_LINES:]))
    print(
        f"{ran} seeds (first {args.first}), {len(failures)} failed, {seconds:.1f} s, "
        f"{ran / max(seconds, 1e-9):.0f} seeds/s, {args.workers} worker(s)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
