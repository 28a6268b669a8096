"""The BMF reproductions' --quick versions (paper 003 figures 2 and 4): tables, CSV and PNG written."""

import pytest

from buffet.pipeline.experiments.registry import run_experiment


@pytest.mark.parametrize("name, stem, column", [("bmf-bars", "bmf_bars", "BMF posterior mean"),
                                                ("bmf-digits", "bmf_digits", "held-out AUC")])
def test_quick_reproduction_writes_its_table_and_figure(tmp_path, name, stem, column):
    files = run_experiment(name, tmp_path, 1, True)
    assert {f.name for f in files} == {f"{stem}.md", f"{stem}.png", f"{stem}.csv"}
    assert column in (tmp_path / f"{stem}.md").read_text()
    assert (tmp_path / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / f"{stem}.csv").read_text().startswith("seed,")
