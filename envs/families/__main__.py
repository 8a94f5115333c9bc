"""``python -m termgym.envs.families OUT --split train --count 300 --seed 0``: write a split."""

from __future__ import annotations

import argparse
import sys

from .names import SPLITS
from .split import FAMILY_SETS, generate_split


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not the usage block
        self.exit(2, f"error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m termgym.envs.families", description=(__doc__ or "").split(":")[0])
    parser.add_argument("out", help="directory to write the task directories and split.json into")
    # no argparse choices: an unknown split or family set is refused by generate_split, with the closest names
    parser.add_argument("--split", default="train", help=f"one of {', '.join(SPLITS)} (default train)")
    parser.add_argument("--count", type=int, default=300, help="number of tasks (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    parser.add_argument(
        "--families", default="short", help=f"family set: one of {', '.join(FAMILY_SETS)} (default short)"
    )
    args = parser.parse_args(argv)
    try:
        paths = generate_split(args.out, args.split, args.count, args.seed, family_set=args.families)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths)} {args.split} tasks of the {args.families} set (seed {args.seed}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
