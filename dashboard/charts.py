"""Curves as inline SVG, rendered on the server by pygal: no script, nothing fetched by the browser.

Each point is a `.dot` in the SVG (up to DOTS_UP_TO points a series; a longer series is a line alone), so
what the page draws can be counted in the browser.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

import pygal
from pygal.style import Style

DOTS_UP_TO = 500
_CONFIG_SCRIPT = re.compile(r"<script[^>]*>window\.pygal.*?</script>", re.S)
_STYLE = Style(background="white", plot_background="white", font_family="system-ui, sans-serif",
               colors=("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"))

Series = Sequence[float | None]


def line_chart(chart_id: str, title: str, x: Sequence[int], series: dict[str, Series], *, x_title: str = "",
               y_range: tuple[float, float] | None = None) -> str:
    """A <figure id=chart_id> holding one line per series over the x values (None: no point there)."""
    longest = max((sum(v is not None for v in s) for s in series.values()), default=0)
    # XY, not Line: numeric x needs no label per point (a fifth faster on 2,500 points)
    chart = pygal.XY(
        js=[],  # pygal's tooltips load a script from the network: the page works offline without it
        disable_xml_declaration=True, explicit_size=True, width=640, height=260, style=_STYLE,
        title=title, x_title=x_title, show_dots=longest <= DOTS_UP_TO, dots_size=2.5,
        truncate_legend=40, x_value_formatter=lambda v: f"{v:g}",
        legend_at_bottom=True, range=y_range, allow_interruptions=True, print_values=False,
        no_data_text="no data yet",
    )
    if len(x) <= 12 and longest:  # (pygal's XY cannot place labels on a chart without a point)
        chart.x_labels = list(x)  # few points: a label on each, not pygal's fractional ticks
    for name, values in series.items():
        chart.add(name, [(a, v) for a, v in zip(x, values, strict=True)])
    # pygal writes its config for its tooltip script inline: without that script (js=[]) it is dead weight
    svg = _CONFIG_SCRIPT.sub("", chart.render(is_unicode=True))
    points = " ".join(f'data-points-{_attr(name)}="{sum(v is not None for v in values)}"' for name, values in series.items())
    return f'<figure class="chart" id="{html.escape(chart_id)}" {points}>{svg}</figure>'


def _attr(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower())
