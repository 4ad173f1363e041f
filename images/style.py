"""The one drawing style of the course's diagrams and plots: palette, fonts, strokes, and a few
SVG helpers. Python standard library only. Used by images/make_diagrams.py and
slides/tools/plot_metrics.py; slides/theme/kit.css uses the same colours."""
from xml.sax.saxutils import escape

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
MONO = "DejaVu Sans Mono, monospace"
INK = "#1f2933"       # text and outlines
MUTED = "#52606d"     # secondary text, axes
GRID = "#cbd2d9"      # grid lines, empty slots
PAPER = "#f5f7fa"     # panel backgrounds
IDLE = "#e4e7eb"      # idle time, empty memory
STROKE = 2            # every outline
# One colour per rank / GPU / stage, in this order, with a light fill of each.
COLORS = ["#2f6fab", "#d9822b", "#3f8f5f", "#7b5ea7", "#c2474f", "#2a9d9f", "#8d6e63", "#6b7a8f"]
LIGHT = ["#d6e4f2", "#f7e2cc", "#d5eadc", "#e4dcef", "#f2d4d6", "#d2eeee", "#e6dcd8", "#dde2ea"]
SUM = "#394b59"       # a reduced (summed) value


class Svg:
    def __init__(self, width, height, title):
        self.w, self.h, self.title, self.items = width, height, title, []

    def add(self, item):
        self.items.append(item)
        return self

    def rect(self, x, y, w, h, fill="none", stroke=INK, sw=STROKE, rx=6, dash=None, opacity=None):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' fill-opacity="{opacity}"' if opacity is not None else ""
        return self.add(f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx:g}" '
                        f'fill="{fill}" stroke="{stroke}" stroke-width="{sw:g}"{extra}/>')

    def text(self, x, y, s, size=18, anchor="middle", fill=INK, weight="normal", mono=False,
             italic=False, rotate=None):
        style = ' font-style="italic"' if italic else ""
        rot = f' transform="rotate({rotate} {x:g} {y:g})"' if rotate is not None else ""
        fam = MONO if mono else FONT
        return self.add(f'<text x="{x:g}" y="{y:g}" font-family="{fam}" font-size="{size:g}" '
                        f'text-anchor="{anchor}" fill="{fill}" font-weight="{weight}"{style}{rot}>'
                        f'{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke=INK, sw=STROKE, dash=None, arrow=False):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += ' marker-end="url(#arrow)"' if arrow else ""
        return self.add(f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{stroke}" '
                        f'stroke-width="{sw:g}"{extra}/>')

    def path(self, d, stroke=INK, sw=STROKE, fill="none", arrow=False, dash=None):
        extra = ' marker-end="url(#arrow)"' if arrow else ""
        extra += f' stroke-dasharray="{dash}"' if dash else ""
        return self.add(f'<path d="{d}" stroke="{stroke}" stroke-width="{sw:g}" fill="{fill}"{extra}/>')

    def polyline(self, points, stroke=INK, sw=STROKE, dash=None, opacity=None):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' stroke-opacity="{opacity}"' if opacity is not None else ""
        return self.add(f'<polyline points="{pts}" fill="none" stroke="{stroke}" stroke-width="{sw:g}" '
                        f'stroke-linejoin="round"{extra}/>')

    def circle(self, x, y, r, fill=INK, stroke="none", sw=STROKE):
        return self.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:g}" fill="{fill}" stroke="{stroke}" '
                        f'stroke-width="{sw:g}"/>')

    def arrow(self, x1, y1, x2, y2, stroke=INK, sw=STROKE, dash=None):
        return self.line(x1, y1, x2, y2, stroke, sw, dash, arrow=True)

    def render(self):
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
                f'viewBox="0 0 {self.w} {self.h}" role="img">\n'
                f'<title>{escape(self.title)}</title>\n'
                '<defs>\n'
                f'<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
                f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{INK}"/></marker>\n'
                f'<pattern id="idle" width="8" height="8" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
                f'<rect width="8" height="8" fill="{IDLE}"/><line x1="0" y1="0" x2="0" y2="8" stroke="{GRID}" stroke-width="3"/></pattern>\n'
                '</defs>\n')
        return head + "\n".join(self.items) + "\n</svg>\n"
