"""wandb=true: the run in Weights & Biases. Online where W&B can be reached with an API key (WANDB_API_KEY or
`wandb login`'s ~/.netrc), offline everywhere else: the run is kept in <run dir>/wandb/offline-run-*, and
`wandb sync <that folder>` uploads it later. WANDB_MODE, where it is set, decides instead. The W&B project is
WANDB_PROJECT, else the run's project with / as - (runs-train); the W&B run is named after the run folder, and
its id is kept there (wandb_run_id.txt) so that a resumed run continues it (W&B's resume="allow").

Metrics are logged against `epoch` (define_metric), not W&B's own step: on a GPU an epoch's validation lands while
the next epoch trains, after that epoch's losses, and W&B drops a step that goes backwards."""

from __future__ import annotations

import netrc
import os
import shutil
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 2.0
ID_FILE = "wandb_run_id.txt"


def wandb_mode() -> str:
    """online | offline (| disabled, where WANDB_MODE says so)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    if not (os.environ.get("WANDB_API_KEY") or _netrc_key(host)):
        return "offline"
    try:
        socket.create_connection((host, 443), timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        return "offline"
    return "online"


def _netrc_key(host: str) -> bool:
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbBackend:
    name = "wandb"

    def __init__(self) -> None:
        self.run: Any = None
        self.run_dir = Path()

    def start(self, run_dir: Path, project: str, params: dict[str, str], resumed: bool) -> None:
        import wandb

        self.run_dir = run_dir
        # no system-metrics sampling: W&B's process would take CPU time from the loader workers
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False)
        id_file = run_dir / ID_FILE
        run_id = id_file.read_text(encoding="utf-8").strip() if resumed and id_file.is_file() else None
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or project.strip("/").replace("/", "-") or "libreyolo",
            name=run_dir.name,
            dir=str(run_dir),
            config=params,
            mode=wandb_mode(),  # type: ignore[arg-type]
            settings=settings,
            id=run_id,
            resume="allow" if run_id else None,
        )
        id_file.write_text(self.run.id + "\n", encoding="utf-8")
        self.run.define_metric("epoch")
        self.run.define_metric("*", step_metric="epoch")

    def metrics(self, values: dict[str, float], epoch: int) -> None:
        self.run.log({**values, "epoch": epoch})

    def artifacts(self, files: list[tuple[Path, str]]) -> None:
        # copied into the W&B run's files folder, under their place in the run folder (plots at the top,
        # weights/best.pt): W&B uploads that folder when the run finishes, or `wandb sync` does later
        files_dir = Path(self.run.dir)
        for path, folder in files:
            rel = path.relative_to(self.run_dir) if path.is_relative_to(self.run_dir) else Path(folder, path.name)
            (files_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, files_dir / rel)

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
