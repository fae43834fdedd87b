"""mlflow=true: the run in MLflow, through `MlflowClient` (no global active run, so it works from the tracker's
thread). The tracking URI is MLFLOW_TRACKING_URI where it is set (a server, a database), else a file store in
./mlruns (`mlflow ui --backend-store-uri ./mlruns` shows it). The experiment is MLFLOW_EXPERIMENT_NAME, else the
run's project (runs/train); the MLflow run is named after the run folder (exp, exp2, ...). Its id is kept in the
run folder (mlflow_run_id.txt), so a resumed run goes on logging into the same MLflow run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

# MLflow takes at most 100 params and 1,000 metrics per log_batch call, and a param value of 6,000 characters
PARAMS_PER_CALL = 100
PARAM_CHARS = 6000
ID_FILE = "mlflow_run_id.txt"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or (Path.cwd() / "mlruns").as_uri()


class MLflowBackend:
    name = "mlflow"

    def __init__(self) -> None:
        self.client: Any = None
        self.run_id = ""

    def start(self, run_dir: Path, project: str, params: dict[str, str], resumed: bool) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = tracking_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 refuses a file store unless asked: it keeps working (maintenance mode), needs no database
            # package, and is what `mlflow ui` reads from ./mlruns
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        if resumed and self._continue(run_dir / ID_FILE):
            return  # its params were logged when it started: MLflow keeps a param's first value, for good
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or project
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        run = client.create_run(exp_id, run_name=run_dir.name, tags={"libreyolo.run_dir": str(run_dir.resolve())})
        self.run_id = run.info.run_id
        (run_dir / ID_FILE).write_text(self.run_id + "\n", encoding="utf-8")
        items = [Param(k, v[:PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_CALL):
            client.log_batch(self.run_id, params=items[i : i + PARAMS_PER_CALL])

    def _continue(self, id_file: Path) -> bool:
        """The MLflow run the interrupted run started, marked running again; False where there is none in this
        store (the run was started without mlflow=true, or MLFLOW_TRACKING_URI points elsewhere now)."""
        from mlflow.exceptions import MlflowException

        if not id_file.is_file():
            return False
        try:
            self.run_id = self.client.get_run(id_file.read_text(encoding="utf-8").strip()).info.run_id
        except MlflowException:
            return False
        self.client.update_run(self.run_id, status="RUNNING")
        return True

    def metrics(self, values: dict[str, float], epoch: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, epoch) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def artifacts(self, files: list[tuple[Path, str]]) -> None:
        for path, folder in files:
            self.client.log_artifact(self.run_id, str(path), folder or None)

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)
