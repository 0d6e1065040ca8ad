import sys

from streambandit.cli import main

sys.exit(main())
