"""The labels stage's plots: real PNG files of the expected content, inlined as markdown."""

import base64
from dataclasses import dataclass

import matplotlib.image

from annotation.progress.plots import label_distribution_plot, progress_curves_plot, quality_plot
from warehouse.plotting import Markdown


@dataclass
class _Trajectory:
    task_id: str
    success: bool
    n_steps: int


def _rows(episode: str, progress: list[float]) -> list[dict]:
    rows = []
    for source, method in (("lcs", "improved"), ("lcs", "paper"), ("env", None)):
        for t, p in enumerate(progress):
            rows.append(
                {
                    "episode_id": episode,
                    "step_idx": t,
                    "source": source,
                    "method": method,
                    "progress": p,
                    "is_key_step": t % 2 == 1,
                }
            )
    return rows


def _inline_png(markdown: str) -> bytes:
    assert isinstance(markdown, Markdown) and markdown.startswith("![")
    return base64.b64decode(markdown.split("base64,", 1)[1].rstrip(")"))


def test_progress_curves_and_distribution_are_written_and_inlined(tmp_path):
    trajectories = {"ok": _Trajectory("login", True, 4), "bad": _Trajectory("login", False, 4)}
    rows = _rows("ok", [0.25, 0.5, 0.75, 1.0]) + _rows("bad", [0.0, 0.25, 0.25, 0.5])
    curves = progress_curves_plot(rows, trajectories, tmp_path / "curves.png", per_outcome=1)
    assert _inline_png(curves)[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(tmp_path / "curves.png")
    assert image.shape[0] > 300 and image.shape[1] > 300  # a real figure, not an empty canvas
    assert image.std() > 0.01
    distribution = label_distribution_plot(rows, tmp_path / "distribution.png")
    assert (tmp_path / "distribution.png").stat().st_size > 1000 and _inline_png(distribution)


def test_quality_plot_has_a_bar_per_task_set_and_method(tmp_path):
    rows = [
        {"task_set": s, "method": m, "key_step_progress_error": e}
        for s, m, e in (("dev", "paper", 0.3), ("dev", "improved", 0.1), ("held_out", "improved", 0.2))
    ]
    markdown = quality_plot(rows, tmp_path / "quality.png")
    assert (tmp_path / "quality.png").exists() and _inline_png(markdown)
