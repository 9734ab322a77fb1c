from voiceedge.cli import main

raise SystemExit(main())
