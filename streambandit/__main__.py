from streambandit.cli import main
import sys
sys.exit(main())
