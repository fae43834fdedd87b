"""`libreyolo bench step` with the Conv blocks' BatchNorm on PyTorch's own kernels instead of cuDNN's.

    python benchmarks/eager_bn.py cudnn|native -- model=LibreYOLO9t batch=8 imgsz=640 modes=eager steps=64 json=true

An experiment (needs a CUDA GPU; one process per form). The eager step is host-bound on the H200, and cuDNN's
channels-last BatchNorm spent ~7.8 ms of host time a step at batch 8 on cooperative launches, memsets and
`cudaFuncSetAttribute` calls (docs/performance.md, eleventh session). `native` passes cudnn_enabled=False to the
blocks' `torch.batch_norm` (nn/blocks.py), so only BatchNorm leaves cuDNN; the convolutions keep it. `cudnn` runs
the library unchanged through the same wrapper."""

from __future__ import annotations

import sys
from typing import Any

import torch


class _NativeBN:
    """Stands in for the `torch` module inside nn/blocks.py: everything is torch's, batch_norm without cuDNN."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def batch_norm(*args: Any) -> torch.Tensor:
        return torch.batch_norm(*args[:-1], False)


def main(form: str, args: list[str]) -> None:
    import libreyolo.cli.main as cli_main
    import libreyolo.nn.blocks as blocks

    if form == "native":
        blocks.torch = _NativeBN()  # type: ignore[assignment]
    elif form != "cudnn":
        raise SystemExit(f"unknown form {form!r}: cudnn or native")
    cli_main.main(["bench", "step", *args])


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[3:])
