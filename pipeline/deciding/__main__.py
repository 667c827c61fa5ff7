"""`python -m pipeline.deciding` (`bash run.sh decide`): pipeline.deciding.loop."""
import sys

from pipeline.deciding.loop import main

sys.exit(main())
