"""Run with -m fidpkg.main from tests/process/scripts/fidelity: what `python -m` sets up."""

import json
import os
import sys

if __name__ == "__main__":
    out = os.environ["FID_OUT"]
    spec = globals().get("__spec__")
    with open(os.path.join(out, f"module{os.environ['RANK']}.json"), "w") as f:
        json.dump({"argv": sys.argv, "name": __name__, "spec": spec.name if spec else None, "file": __file__,
                   "path0": sys.path[0], "package": __package__}, f)
