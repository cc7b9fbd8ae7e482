"""`python -m minicluster.operator [--namespace NS]...`."""
import argparse

from minicluster.operator import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m minicluster.operator")
    parser.add_argument("--namespace", "-n", action="append",
                        help="watch only this namespace; repeat or separate by commas for several "
                             "(default: MC_OPERATOR_NAMESPACES, else all)")
    args = parser.parse_args()
    try:
        run(",".join(args.namespace or ()))
    except ValueError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    main()
