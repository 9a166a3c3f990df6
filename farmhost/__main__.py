"""`python -m farmhost` runs the command line."""

from farmhost.cli import main

raise SystemExit(main())
