"""`bench rewrite` on the tiny model: the kept-share curve falls with strength (pinned tokens by construction)."""

from dgemma_lsp.bench import rewrite

SOURCE = '''import math


def area(radius):
    """The area of a circle."""
    return math.pi * radius * radius


def ring(outer, inner):
    return area(outer) - area(inner)
'''


def test_the_kept_share_falls_as_strength_rises(tmp_path):
    file = tmp_path / "circles.py"
    file.write_text(SOURCE)
    report = rewrite.run_benchmark("tiny-random", steps=4, seeds=1, keeps=["canvas"], strengths=[0.1, 1.0], file=file,
                                   limit=2, max_selection_tokens=320)
    assert report.selections == 2
    share = {point.strength: point.kept_share for point in report.curve}
    assert share[0.1] >= 0.7 > share[1.0]
    assert "canvas" in rewrite.format_table(report)
