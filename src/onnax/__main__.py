"""``python -m onnax``: the command line."""

from onnax.cli import main

raise SystemExit(main())
