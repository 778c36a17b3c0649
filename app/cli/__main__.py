"""``python -m app.cli``: the `kvprimer` command line."""
import sys

from . import main

sys.exit(main())
