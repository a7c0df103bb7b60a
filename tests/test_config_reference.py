"""docs/CONFIG.md's key reference is the config dataclasses' own: it cannot drift from them."""

from pathlib import Path

from pipeline.job import config_reference

PAGE = Path(__file__).resolve().parents[1] / "docs" / "CONFIG.md"


def test_the_page_lists_every_key_as_the_dataclasses_define_it():
    assert config_reference.generated_part(PAGE.read_text()) == config_reference.render(), (
        "docs/CONFIG.md's key reference is out of date with the config dataclasses: run "
        "python -m pipeline.job.config_reference --write docs/CONFIG.md")


def test_every_key_has_a_row_with_its_type_and_default():
    text = config_reference.render()
    for key in ("target.path", "drafter.block_size", "data.batching", "cluster.rates.profile",
                "train.optim.lr", "train.checkpoint.every", "train.eval.every",
                "logger.wandb_init"):
        assert f"| `{key}` |" in text, key
    assert "one of `sdpa`, `flex`" in text  # a `one of NAME` comment names NAME's values


def test_write_replaces_only_the_generated_part(tmp_path):
    page = tmp_path / "CONFIG.md"
    page.write_text(f"# intro\n\n{config_reference.BEGIN}\nold\n{config_reference.END}\n\ntail\n")
    assert config_reference.write(page)
    text = page.read_text()
    assert text.startswith("# intro\n\n") and text.endswith("\ntail\n")
    assert config_reference.generated_part(text) == config_reference.render()
    assert not config_reference.write(page)  # the second time nothing changes
