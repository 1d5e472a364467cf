from ds4tui.cli import main

raise SystemExit(main())
