from llmtop.cli import main

raise SystemExit(main())
