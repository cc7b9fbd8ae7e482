"""`python -m minicluster ...` is `mc ...`."""
import sys

from minicluster.cli.main import main

sys.exit(main())
