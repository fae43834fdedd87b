"""One `profile run` trial in a fresh Python process: `python -m libreyolo.cli.profile_trial OVERRIDES PROJECT NAME`.

`--repeat N` runs each of its N trials here, so that no trial inherits what an earlier one left in the process:
the CUDA context, cuDNN's autotuning cache, the caching allocator's segments, loader worker processes, imported
and compiled code. OVERRIDES is the run's key=value settings as a JSON object; the trial writes its run folder
PROJECT/NAME (profile.json among the artifacts) and exits 0, or exits 1 with the reason on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from libreyolo import oom
    from libreyolo.cli.profile_run import profile_once
    from libreyolo.errors import LibreYOLOError

    if len(argv) != 3:
        sys.stderr.write(__doc__.splitlines()[0] + "\n")
        return 2
    overrides, project, name = json.loads(argv[0]), argv[1], argv[2]
    try:
        with oom.explained(lambda: oom.config_spec("profiling", overrides, oom.PROFILE)):
            profile_once(overrides, Path(project), name, exist_ok=True)
    except LibreYOLOError as e:
        sys.stderr.write(f"libreyolo profile trial: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
