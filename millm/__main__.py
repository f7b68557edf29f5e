"""`python -m millm` runs the same CLI as the `millm` console script."""

from millm.cli import main

raise SystemExit(main())
