"""Dump this worker's environment to LAUNCH_TEST_OUT/rank<RANK>.json (no torch: used under torchrun and ddpboot)."""

import json
import os
import sys
from pathlib import Path

out = Path(os.environ["LAUNCH_TEST_OUT"])
(out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({"env": dict(os.environ), "argv": sys.argv[1:]}))
