"""The base of the text panels: keep the latest snapshot, render it at the current width."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group, RenderableType
from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView


class ViewPanel(Widget):
    """A panel drawn from one snapshot. ``show()`` stores it; ``build()`` (overridden by
    each panel) turns it into a renderable for the width the layout gives."""

    DEFAULT_CSS = """
    ViewPanel { height: auto; }
    """

    READS: ClassVar[tuple[str, ...] | None] = None
    """The snapshot's top-level keys this panel draws from (``None``: all of them). A new
    snapshot equal to the last one in these keys is not redrawn: rendering, not
    fetching, is what costs CPU in a terminal UI."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.view = SnapView(None)
        self.palette = Palette()
        self._signature: object = None
        self._layout_key: object = None
        self._drawn = False

    def signature(self, view: SnapView) -> object:
        """What must differ for the panel to look different."""
        if self.READS is None:
            return view.raw
        # (whether there is a snapshot at all counts too: "n/a" before the first one)
        return (bool(view.raw), *(view.raw.get(k) for k in self.READS))

    def layout_key(self, view: SnapView) -> object:
        """What must differ for the panel's height to change (default: anything)."""
        return self.signature(view)

    def show(self, view: SnapView, palette: Palette) -> None:
        """Take a new snapshot; redraw only when it changes what the panel shows, and
        lay out again only when its height may change."""
        signature, layout_key = self.signature(view), self.layout_key(view)
        self.view = view
        if self._drawn and signature == self._signature and palette == self.palette:
            return
        relayout = not self._drawn or layout_key != self._layout_key
        self.palette = palette
        self._signature, self._layout_key, self._drawn = signature, layout_key, True
        self.refresh(layout=relayout)

    def build(self, width: int) -> RenderableType:
        """The panel's content for ``width`` cells; a panel with nothing to say is empty."""
        return Text("")

    def render(self) -> RenderableType:
        built = self.build(max(1, self.content_region.width or self.size.width))
        # Textual turns a bare Text into its own Content, which wraps by the widget's CSS
        # and ignores the Text's ``no_wrap``/``overflow``. Wrapped in a Group it is drawn
        # by Rich, exactly as get_content_height measured it.
        return Group(built) if isinstance(built, Text) else built

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width <= 0:
            return 0
        console = self.app.console
        lines = console.render_lines(
            self.build(width), console.options.update(width=width, height=None), pad=False
        )
        return len(lines)



def flow(parts: list[Text], width: int, sep: str = "  ") -> Text:
    """``parts`` joined by ``sep`` on as few lines as ``width`` allows, a line breaking
    only between parts (never inside "preempt 0"); a part wider than a line is cut
    with an ellipsis."""
    out = Text(no_wrap=True, overflow="ellipsis")
    used = 0
    for part in parts:
        n = part.cell_len
        if used and used + len(sep) + n > width:
            out.append("\n")
            used = 0
        elif used:
            out.append(sep)
            used += len(sep)
        out.append_text(part)
        used += n
    return out
