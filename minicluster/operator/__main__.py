"""`python -m minicluster.operator [--namespace NS]`."""
import argparse

from minicluster.operator import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m minicluster.operator")
    parser.add_argument("--namespace", "-n", help="watch only this namespace (default: all)")
    args = parser.parse_args()
    run(args.namespace)


if __name__ == "__main__":
    main()
