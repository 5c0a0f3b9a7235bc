"""The base of the text panels: keep the latest snapshot, render it at the current width."""

from __future__ import annotations

from rich.console import RenderableType
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

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.view = SnapView(None)
        self.palette = Palette()

    def show(self, view: SnapView, palette: Palette) -> None:
        """Take a new snapshot and redraw (layout too: the height may change)."""
        self.view = view
        self.palette = palette
        self.refresh(layout=True)

    def build(self, width: int) -> RenderableType:
        """The panel's content for ``width`` cells; a panel with nothing to say is empty."""
        return Text("")

    def render(self) -> RenderableType:
        return self.build(max(1, self.content_region.width or self.size.width))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width <= 0:
            return 0
        console = self.app.console
        lines = console.render_lines(
            self.build(width), console.options.update(width=width, height=None), pad=False
        )
        return len(lines)
