import re
from pathlib import Path

import pytest

from libreyolo.cli.main import main
from libreyolo.config import TrainConfig
from libreyolo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_typed_values_and_aliases():
    c = TrainConfig.from_overrides(
        {"epochs": "5", "device": [0, 1], "amp_dtype": "bf16", "cache": True, "cuda_graph": "full", "workers": "auto"}
    )
    assert (c.epochs, c.device, c.amp_dtype, c.cache, c.cuda_graph, c.workers) == (
        5,
        "0,1",
        "bfloat16",
        "ram",
        "full",
        None,
    )
    for spec, want in [
        ("cpu", "cpu"),
        ("0", "0"),
        ("cuda:1", "1"),
        ("[0, 1]", "0,1"),
        ("auto", "auto"),
        ("mps", "mps"),
    ]:
        assert TrainConfig.parse_value("device", spec) == want


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("batch", 0, "batch=0 is not valid: batch takes a positive integer, or -1"),
        ("imgsz", 100, "imgsz=100 is not valid: imgsz takes a multiple of 32"),
        ("amp", "maybe", "amp='maybe' is not valid: amp takes a boolean"),
        ("amp_dtype", "fp8", "one of float16, bfloat16"),
        ("device", "gpu", "device='gpu' is not valid"),
    ],
)
def test_bad_values_name_key_value_and_what_is_accepted(key, value, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        TrainConfig.from_overrides({key: value})


def test_unknown_key_suggests_nearest():
    with pytest.raises(ConfigError, match="Did you mean epochs"):
        TrainConfig.from_overrides({"epoch": 3})


def test_cli_errors_exit_2_with_message(capsys):
    assert main(["train", "epoch=3"]) == 2
    assert "Did you mean epochs" in capsys.readouterr().err
    assert main(["train", "epochs"]) == 2
    assert "not key=value" in capsys.readouterr().err
    assert main(["trian"]) == 2
    assert "did you mean 'train'" in capsys.readouterr().err
    assert main(["train", "device=7"]) == 2
    assert "device=7" in capsys.readouterr().err


def test_train_help_lists_every_key_with_default(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for key, _default, _help, _ in TrainConfig.spec():
        assert re.search(rf"^\s*{key}\s", out, re.M), key


def test_hyperparameter_doc_is_in_step_with_trainconfig():
    from libreyolo.cli.docs import hyperparameters_markdown

    doc = (ROOT / "docs" / "hyperparameters.md").read_text()
    assert doc == hyperparameters_markdown(), "regenerate with: python -m libreyolo.cli.docs > docs/hyperparameters.md"


def test_a_datasets_suggestions_fill_only_the_keys_the_user_did_not_give():
    """from_overrides records which keys the user gave; the built-in dataset's suggestions (imgsz, epochs, ...) do
    not override them, and the family's defaults do not count as given."""
    cfg = TrainConfig.from_overrides({"imgsz": 320, "batch": 4})
    assert cfg.user_keys == {"imgsz", "batch"}
    cfg.fill_unset({"imgsz": 128, "epochs": 30})
    assert cfg.imgsz == 320 and cfg.epochs == 30 and cfg.batch == 4
    assert "user_keys" not in TrainConfig.keys() and "user_keys" not in cfg.to_dict()
