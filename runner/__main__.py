"""`python -m tarantella.runner` is `tntrun`."""
import sys

from tarantella.runner.cli import main

sys.exit(main())
