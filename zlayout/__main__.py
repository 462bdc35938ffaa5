import sys

from zlayout.cli import main

sys.exit(main())
