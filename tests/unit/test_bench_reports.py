"""The benchmark reports in bench/results/ are what their benchmark renders from the JSON beside
them: a figure in a report is a measured one, and no report is edited by hand."""

import importlib
import json
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_report_is_its_json_rendered(name):
    module = importlib.import_module(f"bench.{name}")
    result = json.loads((RESULTS / f"{name}.json").read_text())
    assert (RESULTS / f"{name}.md").read_text() == module.render(result)
    assert result["command"].startswith(f"python -m bench.{name}")


def test_every_benchmark_module_is_listed_and_every_result_has_its_benchmark():
    runnable = {
        p.stem for p in (ROOT / "bench").glob("*.py") if f'harness.main("{p.stem}"' in p.read_text()
    }
    assert runnable == set(BENCHMARKS)
    assert {p.stem for p in RESULTS.glob("*.json")} == set(BENCHMARKS)
    assert {p.stem for p in RESULTS.glob("*.md")} == set(BENCHMARKS)


def test_the_bench_package_is_not_imported_by_streambandit():
    for path in (ROOT / "streambandit").rglob("*.py"):
        text = path.read_text()
        assert "from bench" not in text and "import bench" not in text, path
