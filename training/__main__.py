import sys

from training.cli.main import main

sys.exit(main())
